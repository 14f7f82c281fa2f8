"""A run's processes and their sockets, read from Linux's /proc, for tests that watch a run.

A run's processes are its driver and everything below it: Ray's gcs_server and raylet are children
of the driver, the workers and agents children of the raylet.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def _decode_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6} print addresses as 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_addr)
    return ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))


def _show(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every TCP socket in LISTEN state in this network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state != LISTEN:
                    continue
                addr, port = local.split(":")
                out[inode] = (_show(_decode_address(addr)), int(port, 16))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, how gRPC prints a v4 loopback bind on a v6 socket
    return ip.is_loopback


def descendants(root: int) -> set[int]:
    """root and every process below it (by parent pid), plus anything left in root's session."""
    parent: dict[int, int] = {}
    session: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(entry)] = int(fields[1])
        session[int(entry)] = int(fields[3])
    found = {root} | {pid for pid, sid in session.items() if sid == root}
    grew = True
    while grew:
        new = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= new
        grew = bool(new)
    return found


def process_name(pid: int) -> str:
    """The program of ``pid``: the base name of its first word (Ray's processes rename themselves,
    e.g. ``ray::RolloutBuffer`` or ``ray::ConsumerWorker.run``)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return f"pid {pid} (gone)"
    return os.path.basename(words[0].decode(errors="replace")) if words else ""


def survivors(pids: set[int], within_s: float) -> dict[int, str]:
    """Those of ``pids`` still alive (pid -> name) once all have ended or ``within_s`` has passed;
    a zombie (no command line) counts as ended."""
    deadline = time.monotonic() + within_s
    while True:
        alive = {pid: process_name(pid) for pid in pids if os.path.exists(f"/proc/{pid}")}
        alive = {pid: name for pid, name in alive.items() if name}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.25)


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def listeners_of(root: int) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket held by root's process tree."""
    table = listening_sockets()
    seen = set()
    for pid in descendants(root):
        for inode in socket_inodes(pid) & table.keys():
            seen.add((process_name(pid), *table[inode]))
    return seen


def processes_named(root: int, name: str) -> list[int]:
    """The pids of root's tree whose :func:`process_name` starts with ``name``, in order."""
    return sorted(pid for pid in descendants(root) if process_name(pid).startswith(name))


def find_process(root: int, name: str) -> int | None:
    """The pid of a process of root's tree whose :func:`process_name` starts with ``name`` (the
    lowest, when several do)."""
    pids = processes_named(root, name)
    return pids[0] if pids else None


def kill_tree(proc: subprocess.Popen) -> None:
    """End a run started with ``start_new_session=True``: its process group, then any process of
    its tree that left the group."""
    tree = descendants(proc.pid) if proc.poll() is None else set()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    for _ in range(40):  # Ray's processes end with the driver; give them a moment
        tree = {pid for pid in tree if os.path.exists(f"/proc/{pid}")}
        if not tree:
            return
        time.sleep(0.25)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
