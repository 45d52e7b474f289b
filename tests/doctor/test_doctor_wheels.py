from __future__ import annotations

from pitstop.doctor.wheels import (
    cpu_install_command,
    local_tag,
    parse_version,
    pick_cuda_wheel,
    public_version,
    tag_cuda,
    tags_for,
)


def test_version_helpers():
    assert tag_cuda("cu128") == (12, 8) and tag_cuda("cu130") == (13, 0) and tag_cuda("cu118") == (11, 8)
    assert parse_version("2.14.1+cu130") == (2, 14, 1) and parse_version("12.4") == (12, 4)
    assert parse_version("") is None and parse_version("abc") is None
    assert public_version("2.14.1+cu130") == "2.14.1" and local_tag("2.14.1+cu130") == "cu130"
    assert local_tag("2.14.1") is None


def test_tags_for_known_and_newer_releases():
    assert tags_for("2.5.1") == ("cu118", "cu121", "cu124")
    # a release newer than the table: the last row's tags plus the installed build's own
    assert tags_for("2.14.1+cu131") == ("cu126", "cu128", "cu130", "cu131")
    assert tags_for("1.13.1") == ()


def test_pick_newest_wheel_the_driver_runs():
    c = pick_cuda_wheel("12.4", "2.5.1", "0.20.1")
    assert c.tag == "cu124"
    assert c.command == (
        "pip install --force-reinstall torch==2.5.1 torchvision==0.20.1 "
        "--index-url https://download.pytorch.org/whl/cu124"
    )
    assert pick_cuda_wheel("12.2", "2.5.1").tag == "cu121"
    assert pick_cuda_wheel("13.1", "2.9.0").tag == "cu130"
    assert pick_cuda_wheel("12.9", "2.9.0").tag == "cu128"


def test_driver_too_old_for_every_wheel_says_upgrade():
    c = pick_cuda_wheel("11.4", "2.9.0")
    assert c.tag is None and c.command == ""
    assert "upgrade the NVIDIA driver" in c.note and "560.28.03" in c.note  # cu126 needs >= 560.28.03


def test_cpu_command():
    assert cpu_install_command("2.14.1+cu130", "0.29.1+cu130") == (
        "pip install --force-reinstall torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu"
    )
