"""Child side of the code sandbox (see :mod:`zbrl.sandbox` and ``docs/sandbox.md``).

Run by the sandbox as ``python -I -S -B -X utf8 runner.py`` (by its path, not as a module) with a
minimal environment, as the leader of its own process group, in its working directory: a fresh
temporary directory (``rlimits`` backend) or the empty tmpfs of a bubblewrap jail (``bwrap``
backend). This file is a standalone script: it imports only the standard library, and never
``subprocess``, ``socket`` or ``ctypes`` (the candidate program inherits this interpreter's memory
through ``fork``).

Protocol. The parent writes the job to the runner's stdin (a :mod:`marshal` dump) and closes it::

    {"source": str, "fn_name": str | None, "inputs": [str, ...], "limits": {...},
     "nproc": int | None}                   (optional: RLIMIT_NPROC computed by the parent)

For stdin/stdout programs each input is the text fed to stdin; for function calls it is the JSON
list of positional arguments. Expected outputs are never sent here: the parent compares. The
runner reads the job to the end of its stdin, compiles the source once, and writes one line per
message to its stdout, each the ``repr`` of a dict of literals (the parent reads them with
``ast.literal_eval``):

    {"ev": "ready"}                                  compiled; tests follow
    {"ev": "compile_error", "error": str}            the source does not compile; nothing ran
    {"ev": "done", "i": int, "status": str, ...}     one per test, in order

Start-up cost matters (one runner per candidate), so the runner imports only built-in and small
modules; ``json`` (for return values) is imported only in function-call mode and ``traceback``
only when something fails.

Each test runs in a fresh process forked from this one (the "test process"), so module state never
leaks between tests and a crash or kill affects one test only. The test process rewires fds 0/1/2
to its own stdin/stdout/stderr, applies the resource limits, installs the audit hook that denies
process creation, sockets, writes outside the working directory and similar, and then runs the
candidate. This runner enforces the per-test wall-clock limit and the output caps, killing the test
process on overrun; the parent enforces the same limits again from outside, with a grace margin,
and kills the whole process group at the end.

Raw statuses in "done": ``ok`` (ran to completion; "ret" carries a function's return value),
``timeout``, ``memory``, ``output_limit``, ``runtime_error``. "stdout" carries what the test
printed (up to the cap) whatever the status.
"""

import _signal
import builtins
import errno
import marshal
import os
import resource
import select
import sys
import time

STDERR_TAIL_BYTES = 2048
TRACEBACK_FRAMES = 20
RESULT_FD = 3
MAX_FD = 1 << 16

# Modules the candidate may not import (process creation, sockets, native calls).
BLOCKED_MODULES = frozenset(
    {
        "_ctypes",
        "_multiprocessing",
        "_posixshmem",
        "_posixsubprocess",
        "_socket",
        "_ssl",
        "ctypes",
        "multiprocessing",
        "pty",
        "socket",
        "ssl",
        "subprocess",
    }
)

# Audit events that are always denied.
BLOCKED_EVENTS = frozenset(
    {
        "_posixsubprocess.fork_exec",
        "ctypes.addressof",
        "ctypes.call_function",
        "ctypes.cdata",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "gc.get_objects",
        "gc.get_referents",
        "gc.get_referrers",
        "os.chmod",
        "os.chown",
        "os.chflags",
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.killpg",
        "os.lchflags",
        "os.link",
        "os.posix_spawn",
        "os.spawn",
        "os.startfile",
        "os.symlink",
        "os.system",
        "pty.spawn",
        "resource.prlimit",
        "resource.setrlimit",
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyaddr",
        "socket.gethostbyname",
        "socket.sendmsg",
        "socket.sendto",
        "subprocess.Popen",
        "webbrowser.open",
    }
)

# Filesystem-changing events, with how many leading arguments are paths.
PATH_EVENTS = {
    "os.mkdir": 1,
    "os.remove": 1,
    "os.rename": 2,
    "os.rmdir": 1,
    "os.removexattr": 1,
    "os.setxattr": 1,
    "os.truncate": 1,
    "os.utime": 1,
    "shutil.chown": 1,
    "shutil.copyfile": 2,
    "shutil.copymode": 2,
    "shutil.copystat": 2,
    "shutil.copytree": 2,
    "shutil.make_archive": 1,
    "shutil.move": 2,
    "shutil.rmtree": 1,
    "shutil.unpack_archive": 2,
}
LIST_EVENTS = frozenset({"os.listdir", "os.scandir"})
STD_STREAM_PATHS = frozenset({"/dev/stdin", "/dev/stdout", "/dev/stderr"})
PROTECTED_ATTRS = frozenset({"__code__", "__globals__", "__closure__"})
REPORT_KINDS = frozenset({"ok", "error", "memory", "output_limit"})
SIGNAL_NAMES = {
    getattr(_signal, name): name
    for name in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGKILL", "SIGTERM")
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(PermissionError):
    """Raised inside the candidate when it attempts something the sandbox denies."""


# --------------------------------------------------------------------------------------------
# Runner (trusted) side
# --------------------------------------------------------------------------------------------


def write_message(obj):
    data = (repr(obj) + "\n").encode("utf-8", "backslashreplace")
    while data:
        written = os.write(1, data)
        data = data[written:]


def user_task_count(uid):
    """Tasks (processes and threads) owned by ``uid``, which is what RLIMIT_NPROC counts."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read().decode("ascii", "replace")
        except OSError:
            continue
        owner = threads = None
        for line in status.splitlines():
            if line.startswith("Uid:"):
                owner = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if owner == uid:
            count += threads or 1
    return count


def read_roots(workdir):
    """Directories and files the candidate may open for reading."""
    roots = {workdir, "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}
    roots.add(os.path.dirname(os.path.realpath(os.__file__)))
    for entry in sys.path:
        if entry:
            roots.add(os.path.realpath(entry))
    for entry in ("/usr/share/zoneinfo", "/etc/localtime"):
        if os.path.exists(entry):
            roots.add(os.path.realpath(entry))
    return roots


def read_job():
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return marshal.loads(b"".join(chunks))
        chunks.append(chunk)


def main():
    job = read_job()
    limits = job["limits"]
    workdir = os.path.realpath(os.getcwd())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Compiling hostile source happens here, so the runner gets the same memory cap.
    memory = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if "nproc" in job:
        nproc = job["nproc"]
    elif os.getuid() != 0:
        nproc = user_task_count(os.getuid()) + int(limits["max_processes"])
    else:
        nproc = None
    # exit()/quit() normally come from the site module, which -S skips; programs use them.
    builtins.exit = builtins.quit = _exit_builtin
    try:
        code = compile(job["source"], "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as exc:
        import traceback

        text = "".join(traceback.format_exception_only(type(exc), exc))
        write_message({"ev": "compile_error", "error": text[-STDERR_TAIL_BYTES:]})
        return
    if job["fn_name"] is not None:
        import json  # noqa: F401 - imported once here, inherited by every test process

    setup = {
        "fn_name": job["fn_name"],
        "limits": limits,
        "nproc": nproc,
        "workdir": workdir,
        "read_roots": read_roots(workdir),
    }
    del job["source"]
    total = limits["total_timeout_s"]
    total_end = time.monotonic() + float(total) if total is not None else float("inf")
    write_message({"ev": "ready"})
    for i, test_input in enumerate(job["inputs"]):
        result = run_test(code, test_input, setup, total_end)
        result["ev"] = "done"
        result["i"] = i
        write_message(result)
        if result["status"] == "timeout" and (
            result.get("total_exhausted") or not limits["continue_after_timeout"]
        ):
            break


def _exit_builtin(code=None):
    raise SystemExit(code)


def _stdin_fd(text):
    if text is None:
        return os.open(os.devnull, os.O_RDONLY)
    data = text.encode("utf-8", "surrogateescape")
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_test(code, test_input, setup, total_end):
    """Fork one test process, feed it, watch it; return the raw result for the parent."""
    limits = setup["limits"]
    fn_mode = setup["fn_name"] is not None
    stdin_fd = _stdin_fd(None if fn_mode else test_input)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # test process: never returns
        exit_code = 70
        try:
            exit_code = child_main(code, test_input, setup, (stdin_fd, out_w, err_w, res_w))
        except BaseException:
            exit_code = 71
        finally:
            os._exit(exit_code)
    for fd in (stdin_fd, out_w, err_w, res_w):
        os.close(fd)
    deadline = min(start + float(limits["timeout_s"]), total_end)
    watch = watch_test(pid, deadline, out_r, err_r, res_r, limits)
    duration = time.monotonic() - start
    result = classify(watch, fn_mode, duration, int(limits["cpu_s"]))
    if watch["killed_for"] == "timeout" and deadline == total_end:
        result["total_exhausted"] = True
        result["detail"] = "total time limit of the program exceeded"
    return result


def watch_test(pid, deadline, out_r, err_r, res_r, limits):
    """Collect the test process's output until it exits, killing it on a limit overrun."""
    caps = {
        out_r: int(limits["max_output_bytes"]),
        err_r: int(limits["max_stderr_bytes"]),
        res_r: int(limits["max_output_bytes"]) + 4096,
    }
    data = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    totals = dict.fromkeys(data, 0)
    poller = select.poll()
    for fd in data:
        poller.register(fd, select.POLLIN)
    pidfd = _pidfd_open(pid)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    open_pipes = len(data)
    exited = False
    killed_for = None
    wait_status = None
    usage = None
    try:
        while open_pipes or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = "timeout"
                break
            if not open_pipes and pidfd is None:
                # No pidfd: poll for exit after the pipes closed.
                done_pid, wait_status, usage = os.wait4(pid, os.WNOHANG)
                if done_pid:
                    exited = True
                    break
                time.sleep(min(0.005, remaining))
                continue
            for fd, _ in poller.poll(remaining * 1000 + 1):
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited = True
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    poller.unregister(fd)
                    open_pipes -= 1
                    continue
                totals[fd] += len(chunk)
                if totals[fd] > caps[fd]:
                    killed_for = "output_limit"
                    break
                if fd == err_r:
                    data[fd] = (data[fd] + chunk)[-STDERR_TAIL_BYTES:]
                else:
                    data[fd] += chunk
            if killed_for:
                break
    finally:
        if killed_for is not None:
            _kill(pid)
        if wait_status is None:
            _, wait_status, usage = os.wait4(pid, 0)
        for fd in (out_r, err_r, res_r):
            os.close(fd)
        if pidfd is not None:
            os.close(pidfd)
    return {
        "killed_for": killed_for,
        "wait_status": wait_status,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "stdout": bytes(data[out_r]),
        "stderr": bytes(data[err_r]),
        "result": bytes(data[res_r]),
    }


def _pidfd_open(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill(pid):
    try:  # noqa: SIM105 - contextlib costs start-up time here
        os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
        pass


def classify(watch, fn_mode, duration, cpu_limit):
    """Turn what the watcher saw into a raw status record."""
    out = {
        "status": "runtime_error",
        "duration": duration,
        "stderr": watch["stderr"].decode("utf-8", "replace"),
        "stdout": watch["stdout"].decode("utf-8", "replace"),
        "detail": "",
    }
    wait_status = watch["wait_status"]
    if watch["killed_for"] is not None:
        out["status"] = watch["killed_for"]
        return out
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig == _signal.SIGXCPU or (sig == _signal.SIGKILL and watch["cpu_s"] >= cpu_limit):
            out["status"] = "timeout"
            out["detail"] = "CPU time limit exceeded"
        elif sig == _signal.SIGXFSZ:
            out["status"] = "output_limit"
            out["detail"] = "file size limit exceeded"
        else:
            out["detail"] = f"killed by signal {SIGNAL_NAMES.get(sig, sig)}"
        return out
    exit_code = os.waitstatus_to_exitcode(wait_status)
    kind, _, payload = watch["result"].decode("utf-8", "replace").partition("\n")
    if kind not in REPORT_KINDS:
        if exit_code == 0 and not fn_mode:
            out["status"] = "ok"  # os._exit(0) skips the report; the output still counts
        else:
            out["detail"] = f"exit status {exit_code}"
        return out
    if kind == "ok" and exit_code == 0:
        out["status"] = "ok"
        if fn_mode:
            out["ret"] = payload
        return out
    out["detail"] = payload[:500]
    if kind in ("memory", "output_limit"):
        out["status"] = kind
    return out


# --------------------------------------------------------------------------------------------
# Test-process (untrusted) side
# --------------------------------------------------------------------------------------------


def child_main(code, test_input, setup, fds):
    stdin_fd, out_w, err_w, res_w = fds
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(res_w, RESULT_FD)
    os.closerange(RESULT_FD + 1, MAX_FD)
    apply_limits(setup["limits"], setup["nproc"])
    stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    stdout = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr
    for name in list(sys.modules):
        if name.partition(".")[0] in BLOCKED_MODULES:
            del sys.modules[name]
    sys.meta_path.insert(0, make_import_blocker())
    sys.addaudithook(make_audit_hook(setup["workdir"], frozenset(setup["read_roots"]), os.getpid()))
    report = execute(code, setup["fn_name"], test_input, stderr)
    for stream in (sys.stdout, stdout, sys.stderr, stderr):
        try:  # noqa: SIM105 - a closed or broken stream must not mask the result
            stream.flush()
        except BaseException:
            pass
    kind, payload = report
    data = f"{kind}\n{payload}".encode("utf-8", "backslashreplace")
    try:
        while data:
            data = data[os.write(RESULT_FD, data) :]
    except OSError:
        return 72
    return 0 if kind == "ok" else 1


def apply_limits(limits, nproc):
    memory = int(limits["memory_mb"]) * 1024 * 1024
    cpu = int(limits["cpu_s"])
    pairs = [
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, (int(limits["max_file_bytes"]),) * 2),
        (resource.RLIMIT_NOFILE, (int(limits["max_open_files"]),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if nproc is not None:
        pairs.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    for which, value in pairs:
        resource.setrlimit(which, value)


def execute(code, fn_name, test_input, stderr):
    """Run the candidate; return ``(kind, payload)`` for the runner (read from fd 3)."""
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
        if fn_name is None:
            return "ok", ""
        json = sys.modules["json"]
        args = json.loads(test_input)
        function = resolve_function(module.__dict__, fn_name)
        value = function(*args)
        try:
            return "ok", json.dumps(value)
        except (TypeError, ValueError) as exc:
            return "error", f"return value is not JSON-serialisable: {exc}"
    except SystemExit as exc:
        status = exc.code
        if status is None or status == 0:
            if fn_name is None:
                return "ok", ""
            return "error", "SystemExit before the function returned"
        if not isinstance(status, int):
            print(status, file=stderr)
        return "error", f"SystemExit({status!r})"
    except MemoryError:
        return "memory", "MemoryError"
    except BaseException as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            return "output_limit", "file size limit exceeded"
        try:  # noqa: SIM105 - printing the traceback is best effort
            print_candidate_traceback(exc, stderr)
        except BaseException:
            pass
        return "error", f"{type(exc).__name__}: {exc}"[:500]


def print_candidate_traceback(exc, stream):
    """Print the traceback of ``exc`` without the runner's own frames."""
    import traceback

    tb = traceback.TracebackException.from_exception(exc, limit=-TRACEBACK_FRAMES)
    tb.stack = traceback.StackSummary.from_list(
        [frame for frame in tb.stack if frame.filename != __file__]
    )
    stream.write("".join(tb.format()))


def resolve_function(namespace, fn_name):
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)
    function = namespace.get(fn_name)
    if callable(function):
        return function
    raise NameError(f"the program defines neither {fn_name}() nor Solution.{fn_name}()")


def make_import_blocker(blocked_modules=BLOCKED_MODULES):
    """Meta-path finder that refuses the blocked modules (a second layer behind the hook)."""

    class ImportBlocker:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.partition(".")[0] in blocked_modules:
                raise ImportError(f"zbrl sandbox: import of {name!r} is not allowed")
            return None

    return ImportBlocker()


def make_audit_hook(
    workdir,
    roots,
    own_pid,
    *,
    blocked_events=BLOCKED_EVENTS,
    blocked_modules=BLOCKED_MODULES,
    path_events=tuple(PATH_EVENTS.items()),
    list_events=LIST_EVENTS,
    protected_attrs=PROTECTED_ATTRS,
    std_stream_paths=STD_STREAM_PATHS,
    write_flags=WRITE_FLAGS,
    violation=SandboxViolation,
    realpath=os.path.realpath,
    fsdecode=os.fsdecode,
):
    """The audit hook of the test process. Best effort: see docs/sandbox.md for its limits.

    Everything the hook consults is bound here, as immutable closure values, so that rebinding
    this module's globals from the candidate does not change the hook's decisions.
    """
    path_arg_counts = dict(path_events)
    write_roots = (workdir, "/dev/null")
    read_roots = (*roots, f"/proc/{own_pid}")

    def inside(path, allowed):
        if isinstance(path, int) or path in std_stream_paths:
            return True  # an fd the process already holds, or its own standard streams
        try:
            resolved = realpath(fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(resolved == root or resolved.startswith(root + "/") for root in allowed)

    def deny(event, detail=""):
        raise violation(f"zbrl sandbox: {event} is not allowed{detail}")

    def hook(event, args):
        if event in blocked_events:
            deny(event)
        if event == "open":
            path, mode, flags = args
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = bool((flags or 0) & write_flags)
            if writing:
                if not inside(path, write_roots):
                    deny("writing", f" outside the working directory ({path!r})")
            elif not inside(path, read_roots):
                deny("reading", f" {path!r}")
        elif event == "import":
            if args[0].partition(".")[0] in blocked_modules:
                raise ImportError(f"zbrl sandbox: import of {args[0]!r} is not allowed")
        elif event in path_arg_counts:
            for path in args[: path_arg_counts[event]]:
                if path is not None and not inside(path, write_roots):
                    deny(event, f" outside the working directory ({path!r})")
        elif event in list_events:
            if args and args[0] is not None and not inside(args[0], read_roots):
                deny(event, f" {args[0]!r}")
        elif event == "os.kill":
            if args[0] != own_pid:
                deny(event, " for other processes")
        elif event == "object.__setattr__" and len(args) > 1 and args[1] in protected_attrs:
            deny(f"setting {args[1]}")

    return hook


if __name__ == "__main__":
    main()
