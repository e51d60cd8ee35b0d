"""Who else listens on a port: so that a server refuses a port another process holds.

The gRPC server sets SO_REUSEPORT, so that a replica changing role can start its new server
object on the port before the old one stops. The kernel lets any process of the same user join
such a port, and then splits the connections between them: a second server with another
database would answer half of the calls for tasks it never saw. So one port is one process:
before it binds, and once more after (two servers started at the same instant both see the
other), a server looks for listening sockets on its port that are not its own.

On Linux the kernel's socket tables (``/proc/net/tcp``, ``tcp6``) list every listening socket,
and ``/proc/PID/fd`` says whose it is (a process of the same user, which is the only kind that
can share the port, is always readable). Elsewhere a trial bind without SO_REUSEPORT tells
whether the port is taken, though not by whom.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from pathlib import Path
from typing import TypeAlias

from cronoq_server._config import Address
from cronoq_server._errors import CronoqServerError

__all__ = ["PortBusy", "busy", "check_alone"]

_PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in the kernel's tables
_MAX_COMMAND = 160
_IP: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


class PortBusy(CronoqServerError, OSError):
    """A listen address is taken; the message is the one line to show."""


def check_alone(setting: str, address: Address, *, bound: bool) -> None:
    """Raise ``PortBusy`` if another process listens on ``address``'s port (on an address
    that overlaps it). ``bound``: this process already listens there itself."""
    if address.port == 0:
        return  # the OS picks a free port (``bound``: pass the one it picked)
    holders = _holders(address)
    if holders or (holders is None and not bound and _taken(address)):
        raise _busy(setting, address, holders)


def busy(setting: str, address: Address) -> PortBusy:
    """The one line for ``address`` being taken (a bind failed), naming the holder if known."""
    return _busy(setting, address, _holders(address))


def _busy(setting: str, address: Address, holders: list[str] | None) -> PortBusy:
    by = f" by {holders[0]}" if holders else ""
    return PortBusy(
        errno.EADDRINUSE,
        f"{setting} = {address}: the port is already in use{by}; stop that process or set "
        f"{setting} to a free port (each cronoq-server process needs ports of its own)",
    )


def _holders(address: Address) -> list[str] | None:
    """Descriptions of the other processes listening on ``address``, or None off Linux."""
    tables = [_PROC / "net" / "tcp", _PROC / "net" / "tcp6"]
    if not tables[0].exists():
        return None
    ours = _socket_inodes(_PROC / "self")
    wanted = _local_ips(address.host)
    foreign: set[int] = set()
    for table in tables:
        for ip, port, inode in _listening(table):
            if port == address.port and inode not in ours and _overlap(_plain(ip), wanted):
                foreign.add(inode)
    if not foreign:
        return []
    found = [
        f"process {pid} ({_command(pid)})"
        for pid in _pids()
        if _socket_inodes(_PROC / str(pid)) & foreign
    ]
    # A socket no readable process holds: another user's, or one being closed.
    return found or ["a process of another user"]


def _listening(table: Path) -> list[tuple[_IP, int, int]]:
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return []
    result = []
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address, _, port = fields[1].partition(":")
        raw = bytes.fromhex(address)
        # The kernel prints each 32-bit word of the address in host (little-endian) order.
        packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        ip = ipaddress.ip_address(packed)
        result.append((ip, int(port, 16), int(fields[9])))
    return result


def _local_ips(host: str) -> set[_IP]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos}


def _overlap(ip: _IP, wanted: set[_IP]) -> bool:
    """Whether connections to one of ``wanted`` could reach a socket bound to ``ip``."""
    return not wanted or any(_covers(ip, w) or _covers(w, ip) for w in map(_plain, wanted))


def _covers(a: _IP, b: _IP) -> bool:
    # An IPv6 wildcard takes IPv4 connections too (Linux's default, bindv6only = 0).
    return a == b or (a.is_unspecified and (a.version == 6 or b.version == 4))


def _plain(ip: _IP) -> _IP:
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip if mapped is None else mapped


def _socket_inodes(process: Path) -> set[int]:
    inodes = set()
    try:
        entries = list((process / "fd").iterdir())
    except OSError:
        return set()  # gone, or another user's
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _pids() -> list[int]:
    me = os.getpid()
    return sorted(int(p.name) for p in _PROC.iterdir() if p.name.isdigit() and int(p.name) != me)


def _command(pid: int) -> str:
    try:
        words = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= _MAX_COMMAND else text[: _MAX_COMMAND - 3] + "..."


def _taken(address: Address) -> bool:
    """A trial bind, as a listener without SO_REUSEPORT would make (SO_REUSEADDR: a port
    whose old connections linger in TIME_WAIT is free)."""
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except OSError:
        return False  # the bind itself will say what is wrong with the host
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def listen_error(setting: str, address: Address, exc: OSError) -> OSError:
    """The one-line error for a bind of ``address`` that failed with ``exc``."""
    if isinstance(exc, PortBusy):
        return exc
    if exc.errno == errno.EADDRINUSE:
        return busy(setting, address)
    return cannot_listen(setting, address, exc.strerror or str(exc))


def cannot_listen(setting: str, address: Address, why: str) -> OSError:
    return OSError(errno.EADDRNOTAVAIL, f"{setting} = {address}: cannot listen there: {why}")
