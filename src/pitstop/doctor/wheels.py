"""Which PyTorch wheel index fits a machine: the one table of CUDA wheel tags, and the install command.

PyTorch publishes one wheel per CUDA runtime at https://download.pytorch.org/whl/<tag>. The wheel
bundles its CUDA runtime, so what must match is the *driver*: it must support that CUDA version
(``nvidia-smi`` prints it as "CUDA Version"). We pick the newest tag the driver supports among those the
torch release ships.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INDEX_URL = "https://download.pytorch.org/whl/{tag}"

# Tags each torch minor release ships on download.pytorch.org, true as of 2025-10 (torch 2.9 release
# matrix, from pytorch.org "previous versions"). Releases after the last row are assumed to ship the
# last row's tags; the installed build's own tag (e.g. 2.14.1+cu130) is always added as known to exist.
WHEEL_TAGS_CHECKED = "2025-10"
CUDA_WHEEL_TAGS: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 0): ("cu117", "cu118"),
    (2, 1): ("cu118", "cu121"),
    (2, 2): ("cu118", "cu121"),
    (2, 3): ("cu118", "cu121"),
    (2, 4): ("cu118", "cu121", "cu124"),
    (2, 5): ("cu118", "cu121", "cu124"),
    (2, 6): ("cu118", "cu124", "cu126"),
    (2, 7): ("cu118", "cu126", "cu128"),
    (2, 8): ("cu126", "cu128", "cu129"),
    (2, 9): ("cu126", "cu128", "cu130"),
}
# Lowest Linux driver that supports each CUDA release (NVIDIA CUDA toolkit release notes, table 3).
MIN_DRIVER = {
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 1): "530.30.02",
    (12, 4): "550.54.14",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}


def tag_cuda(tag: str) -> tuple[int, int]:
    """ "cu128" -> (12, 8); "cu130" -> (13, 0)."""
    digits = tag.removeprefix("cu")
    return int(digits[:-1]), int(digits[-1])


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """ "12.4" -> (12, 4); "2.14.1+cu130" -> (2, 14, 1); junk -> None."""
    if not text:
        return None
    m = re.match(r"(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def public_version(torch_version: str) -> str:
    """ "2.14.1+cu130" -> "2.14.1" (pip wants the version without the local tag with an --index-url)."""
    return torch_version.split("+", 1)[0]


def local_tag(version: str) -> str | None:
    """ "2.14.1+cu130" -> "cu130"; "2.14.1" -> None."""
    return version.split("+", 1)[1] if "+" in version else None


def tags_for(torch_version: str) -> tuple[str, ...]:
    v = parse_version(torch_version) or (0, 0)
    key = (v[0], v[1]) if len(v) >= 2 else (v[0], 0)
    known = CUDA_WHEEL_TAGS.get(key)
    if known is None:
        newest = max(CUDA_WHEEL_TAGS)
        known = CUDA_WHEEL_TAGS[newest] if key > newest else ()
    own = local_tag(torch_version)
    if own and own.startswith("cu") and own[2:].isdigit() and own not in known:
        known = (*known, own)
    return tuple(sorted(known, key=tag_cuda))


@dataclass(frozen=True)
class WheelChoice:
    tag: str | None  # None: this torch release has no wheel the driver can run
    command: str
    note: str


def install_command(torch_version: str, torchvision_version: str | None, tag: str) -> str:
    pkgs = f"torch=={public_version(torch_version)}"
    if torchvision_version:
        pkgs += f" torchvision=={public_version(torchvision_version)}"
    return f"pip install --force-reinstall {pkgs} --index-url {INDEX_URL.format(tag=tag)}"


def pick_cuda_wheel(
    driver_cuda: str | None, torch_version: str, torchvision_version: str | None = None
) -> WheelChoice:
    """The newest CUDA wheel of this torch release that the driver (supporting ``driver_cuda``) runs."""
    tags = tags_for(torch_version)
    drv = parse_version(driver_cuda)
    fits = [t for t in tags if drv is None or tag_cuda(t) <= drv[:2]]
    if fits:
        tag = fits[-1]
        why = f"driver supports CUDA {driver_cuda}" if drv else "driver CUDA version unknown"
        return WheelChoice(
            tag,
            install_command(torch_version, torchvision_version, tag),
            f"{why}; torch {public_version(torch_version)} ships {', '.join(tags) or 'no known CUDA wheels'} "
            f"(wheel table checked {WHEEL_TAGS_CHECKED})",
        )
    oldest = tags[0] if tags else None
    need = MIN_DRIVER.get(tag_cuda(oldest)) if oldest else None
    note = (
        f"the driver supports CUDA {driver_cuda}, older than every CUDA wheel of torch "
        f"{public_version(torch_version)} ({', '.join(tags) or 'none known'}): upgrade the NVIDIA driver"
        + (f" to >= {need}" if need else "")
        + " (recommended), or install an older torch release built for your CUDA"
    )
    return WheelChoice(None, "", note)


def cpu_install_command(torch_version: str, torchvision_version: str | None) -> str:
    return install_command(torch_version, torchvision_version, "cpu")
