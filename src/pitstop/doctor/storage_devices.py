"""Where a path lives: its mount (from /proc/self/mountinfo) and the block device chain behind it (from /sys)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.host.sysfs import read_int, read_text

NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "9p", "afs", "davfs", "ncpfs",
    "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.goofys", "fuse.mountpoint-s3",
    "fuse.juicefs", "fuse.blobfuse", "fuse.blobfuse2", "fuse.ceph-fuse", "fuse.glusterfs",
}  # fmt: skip
PARALLEL_FS = {
    "lustre",
    "gpfs",
    "beegfs",
    "fuse.beegfs",
    "wekafs",
    "pvfs2",
    "orangefs",
}  # fast HPC shared storage
MEMORY_FS = {"tmpfs", "ramfs"}
VIRTUAL_DISKS = {"virtio", "xen"}


# --- where the path lives ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    dev: str  # "major:minor" as mountinfo gives it
    options: str


def _unescape(s: str) -> str:
    # mountinfo octal-escapes space, tab, newline and backslash
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        s = s.replace(code, ch)
    return s


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        mounts.append(Mount(_unescape(a[4]), b[0], _unescape(b[1]), a[2], b[2] if len(b) > 2 else ""))
    return mounts


def find_mount(path: str | os.PathLike[str], mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: longest mount-point prefix (the last one mounted wins on ties)."""
    p = os.path.realpath(path)
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (p == mp or p.startswith(mp + "/") or mp == "/") and (
            best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")
        ):
            best = m
    return best


@dataclass
class BlockDevice:
    name: str  # the whole disk(s) at the bottom, e.g. "nvme0n1", "sda", "md0 (sda, sdb)"
    kind: str  # nvme / ssd / hdd / virtio / zram / loop / network-block / unknown
    rotational: bool | None
    chain: list[str] = field(default_factory=list)  # how we got there: sda2 -> sda, dm-0 -> nvme0n1p3 ...
    model: str | None = None


def _kind(name: str, rotational: bool | None) -> str:
    for prefix, kind in (
        ("nvme", "nvme"), ("vd", "virtio"), ("xvd", "xen"), ("zram", "zram"), ("loop", "loop"),
        ("nbd", "network-block"), ("rbd", "network-block"), ("mmcblk", "sd-card"), ("pmem", "pmem"),
    ):  # fmt: skip
        if name.startswith(prefix):
            return kind
    if rotational is None:
        return "unknown"
    return "hdd" if rotational else "ssd"


def block_device(dev: str, sys_root: str | os.PathLike[str] = "/sys", _depth: int = 0) -> BlockDevice | None:
    """Walk /sys from a "major:minor" to the physical disk(s): partition -> disk, dm-*/md* -> slaves."""
    link = Path(sys_root, "dev", "block", dev)
    if not link.exists():
        return None
    node = Path(os.path.realpath(link))
    return _walk(node, sys_root, _depth)


def _walk(node: Path, sys_root: str | os.PathLike[str], depth: int) -> BlockDevice:
    chain = [node.name]
    if (node / "partition").exists():  # a partition's sysfs dir sits inside its disk's
        node = node.parent
        chain.append(node.name)
    slaves = sorted((node / "slaves").glob("*")) if (node / "slaves").is_dir() else []
    if slaves and depth < 8:  # device-mapper (LVM, LUKS) or md RAID: the disks underneath decide
        below = [_walk(Path(os.path.realpath(s)), sys_root, depth + 1) for s in slaves]
        rot = [b.rotational for b in below]
        rotational = True if any(rot) else (False if all(r is False for r in rot) else None)
        kinds = {b.kind for b in below}
        label = read_text(node / "dm" / "name") or node.name
        return BlockDevice(
            f"{label} ({', '.join(b.name for b in below)})",
            kinds.pop() if len(kinds) == 1 else "mixed",
            rotational,
            chain + [c for b in below for c in b.chain],
            next((b.model for b in below if b.model), None),
        )
    rot_int = read_int(node / "queue" / "rotational")
    rotational = None if rot_int is None else bool(rot_int)
    model = read_text(node / "device" / "model")
    backing = read_text(node / "loop" / "backing_file")
    if backing:
        chain.append(f"backing file {backing}")
    return BlockDevice(node.name, _kind(node.name, rotational), rotational, chain, model)
