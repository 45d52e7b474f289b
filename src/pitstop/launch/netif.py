"""Which network interface reaches the master: NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME for multi-node runs.

NCCL picks an interface by its own heuristics and on hosts with docker0, VPN or several NICs it often
picks one that cannot reach the other nodes, so the job hangs at init. We ask the kernel's routing
table instead: connect() on a UDP socket chooses the source address without sending a packet.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from pitstop.launch.binding import LaunchError


@dataclass(frozen=True)
class Route:
    master: str  # as given
    master_ip: str
    source_ip: str
    interface: str
    loopback: bool


def resolve(host: str, port: int) -> tuple[int, str]:
    """(address family, ip) of ``host``; LaunchError when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as e:
        raise LaunchError(f"cannot resolve master address {host!r}: {e}") from None
    fam, _, _, _, addr = infos[0]
    return fam, str(addr[0])


def source_address(ip: str, port: int, family: int = socket.AF_INET) -> str:
    """The local address the kernel would send from to reach ``ip`` (UDP connect: no packet is sent)."""
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, port))
        except OSError as e:
            raise LaunchError(f"no route to master {ip}:{port}: {e}") from None
        return str(s.getsockname()[0])


def interface_of(ip: str, addrs: Mapping[str, list[Any]] | None = None) -> str | None:
    """Name of the interface that holds ``ip`` (psutil.net_if_addrs), or None."""
    addrs = psutil.net_if_addrs() if addrs is None else addrs
    want = ipaddress.ip_address(ip.split("%")[0])
    for name, entries in addrs.items():
        for a in entries:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(str(a.address).split("%")[0]) == want:
                    return name
            except ValueError:
                continue
    return None


def route_to_master(
    host: str,
    port: int,
    addrs: Mapping[str, list[Any]] | None = None,
    stats: Mapping[str, Any] | None = None,
) -> Route:
    """Resolve the master, find the source address and its interface, and check the interface is up."""
    fam, ip = resolve(host, port)
    src = source_address(ip, port, fam)
    name = interface_of(src, addrs)
    if name is None:
        raise LaunchError(f"source address {src} for master {host} ({ip}) is on no known interface")
    stats = psutil.net_if_stats() if stats is None else stats
    st = stats.get(name)
    if st is not None and not st.isup:
        raise LaunchError(f"interface {name} (route to master {host}) is down")
    return Route(host, ip, src, name, ipaddress.ip_address(ip.split("%")[0]).is_loopback)


def check_ifname(value: str, addrs: Mapping[str, list[Any]] | None = None) -> list[str]:
    """Interfaces named in a user's NCCL_SOCKET_IFNAME that do not exist here (prefix and ^/= forms kept)."""
    addrs = psutil.net_if_addrs() if addrs is None else addrs
    missing = []
    for part in value.split(","):
        p = part.strip()
        if not p or p.startswith("^"):
            continue  # exclusion lists cannot be "missing"
        exact = p.startswith("=")
        p = p.lstrip("=")
        if not any(n == p if exact else n.startswith(p) for n in addrs):
            missing.append(p)
    return missing
