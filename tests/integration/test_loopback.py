"""A local run listens on loopback only: every process it starts, every listening socket.

The run (``zbrl train``, or the Python API in a process that imported ray first) is a subprocess
in its own session, without the Ray variables that the Makefile and conftest set, so the check
covers what zbrl itself does. While it runs, the test reads the run's process tree from /proc and
maps the LISTEN sockets of /proc/net/tcp{,6} to those processes through the socket inodes in
/proc/PID/fd.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
# what a local run starts, by the start of the process's command line (Ray names actor processes
# ray::ClassName); every one of them must have been seen listening before the test concludes
EXPECTED = (
    "python",  # the driver
    "gcs_server",
    "raylet",
    "ray::RolloutBuffer",
    "ray::WeightStore",
    "ray::TelemetryHub",
    "ray::ProducerWorker",
    "ray::ConsumerWorker",
    "ray::EvaluatorWorker",
    "ray::RuntimeEnvAgent",
)
RAY_VARIABLES = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")
POLLS_AFTER_ALL_SEEN = 5
BOUND_S = 420.0  # upper bound on the whole test; a normal pass takes well under a minute


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
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid} (gone)"
    return os.path.basename(cmdline[0].decode(errors="replace").split()[0]) if cmdline[0] else ""


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


def test_local_run_listens_on_loopback_only(tmp_path):
    overrides = [
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={tmp_path / 'cache'}",
        "logging.progress=false",
        "logging.save_final=false",
        "model.warm_start.steps=5",
        "data.synthetic.num_train=64",
        "data.num_epochs=1000",  # far longer than the test watches; it is killed at the end
        "eval.max_prompts=2",
        "rollout.generation.max_new_tokens=8",
        "rollout.generation.num_generations=2",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
        "training.max_steps=1000000",
    ]
    command = [sys.executable, "-m", "zbrl.cli", "train", str(DEMO), *overrides]
    check_listeners(command, tmp_path, EXPECTED)


# The Python API, in a process that imported ray before zbrl (so Ray read its environment, without
# the loopback variable, before zbrl could set it); it holds Ray up until its stdin closes.
API_SCRIPT = """
import sys

import ray

from zbrl.config import load_config
from zbrl.launch.ray_setup import init_ray

assert init_ray(load_config(sys.argv[1], []))


@ray.remote(num_cpus=0)
class Pinger:
    def ping(self):
        return "pong"


pinger = Pinger.remote()
assert ray.get(pinger.ping.remote(), timeout=300) == "pong"
sys.stdin.read()
"""


def test_python_api_after_an_early_import_of_ray_listens_on_loopback_only(tmp_path):
    command = [sys.executable, "-c", API_SCRIPT, str(DEMO)]
    expected = ("python", "gcs_server", "raylet", "ray::RuntimeEnvAgent", "ray::Pinger")
    check_listeners(command, tmp_path, expected)


def check_listeners(command: list[str], tmp_path: Path, expected: tuple[str, ...]) -> None:
    """Start ``command`` without the Ray variables that the Makefile and conftest set, watch its
    process tree's listening sockets until every ``expected`` process was seen listening (and a
    few polls more), then end it; every socket seen must be bound to loopback."""
    env = {k: v for k, v in os.environ.items() if k not in (*RAY_VARIABLES, "RAY_ADDRESS")}
    log = tmp_path / "process.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,  # its own process group: killed as a whole below
        )
    seen: set[tuple[str, str, int]] = set()
    polls_after_all_seen = 0
    deadline = time.monotonic() + BOUND_S
    try:
        while polls_after_all_seen < POLLS_AFTER_ALL_SEEN and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            seen |= listeners_of(proc.pid)
            if not _missing(expected, seen):
                polls_after_all_seen += 1
            time.sleep(0.5)
        alive = proc.poll() is None
    finally:
        kill_run(proc)
    output = log.read_text()[-3000:]
    print("listeners seen:", *sorted(seen), sep="\n  ")  # shown with pytest -s
    assert alive, f"the process ended before it was inspected:\n{output}"
    missing = _missing(expected, seen)
    assert not missing, f"never saw {missing} listening; seen: {sorted(seen)}\n{output}"
    assert len(seen) >= len(expected) + 1  # the raylet has two ports
    wide = sorted(s for s in seen if not is_loopback(s[1]))
    assert not wide, f"listening beyond loopback: {wide}"


def _missing(expected: tuple[str, ...], seen: set[tuple[str, str, int]]) -> list[str]:
    names = {name for name, _, _ in seen}
    return [e for e in expected if not any(n.startswith(e) for n in names)]


def kill_run(proc: subprocess.Popen) -> None:
    """End the run: its process group, then any process of its tree that left the group."""
    tree = descendants(proc.pid) if proc.poll() is None else set()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
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
