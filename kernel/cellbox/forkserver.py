"""Warm start: a fork server that forks each run from an interpreter that has already imported its modules.

A fresh interpreter per run costs tens of milliseconds, and far more when the
run imports IPython, numpy or matplotlib.  A :class:`ForkServer` keeps one
warm, single-threaded, low-priority process per kernel session (or grading
worker) that has imported the cell runner and a preload list; each run is a
child forked from it (see :mod:`cellbox._forkserver_child` for the child
side).  It sits behind the sandbox core's API::

    server = ForkServer(task=task)
    outcome = run([sys.executable, "-m", "cellbox.cellrunner", spec], forkserver=server, task=task)

and every run still starts pristine, under the same limits, with the same
scrubbed environment, supervised and killed by the launcher's own code.

A run goes to the fork server only when it can be run there exactly as a spawn
would run it; otherwise (see :meth:`ForkServer.refusal`) it is spawned, and
when the fork server fails it is spawned with a note:

* the command must be ``[sys.executable, "-m", MODULE, ...]``;
* no bubblewrap isolation layer (``net``, ``pid``, ``fs``, ``user``): those
  wrap the launcher in namespaces per run; Landlock alone is applied per run;
* a memory limit at least :data:`MEMORY_HEADROOM` above the server's address
  space, which every forked child starts with;
* the server is ready (a run that comes while it still imports is spawned);
* the server's environment is unchanged: a package installed or removed since
  it started (a changed site directory) restarts it first.
"""

from __future__ import annotations

import json
import os
import resource
import site
import socket
import sys
import threading
from collections.abc import Sequence
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .environment import TaskDirectory
from .isolation import BWRAP_LAYERS
from .limits import Limits
from .outcome import Outcome

if TYPE_CHECKING:
    from .sandbox import _PidsCgroup

__all__ = ["ForkServer", "ForkServerError", "DEFAULT_PRELOAD", "default_preload", "START_METHODS"]

START_METHODS = ("spawn", "forkserver")
# What the lessons use, imported by the server when installed.
DEFAULT_PRELOAD = (
    "cellbox.cellrunner",
    "cellbox.cellshell",
    "cellbox.magics",
    "cloudpickle",
    "IPython",
    "numpy",
    "matplotlib",
    "matplotlib_inline.backend_inline",
)
# Bytes of address space a forked run needs beyond the server's own before
# its memory limit is worth forking under (RLIMIT_AS counts what it inherited).
MEMORY_HEADROOM = 128 * 1024**2
# Seconds a hand-off may take before the run is spawned instead.
HANDOFF_TIMEOUT = 5.0
# Seconds the server may take to import its preload list.
READY_TIMEOUT = 120.0


class ForkServerError(RuntimeError):
    """The fork server could not take a run (it died, timed out or refused); the run is spawned instead."""


def default_preload() -> list[str]:
    """:data:`DEFAULT_PRELOAD` without the modules whose top-level package is not installed.

    Only top-level packages are looked up: ``find_spec`` of a dotted name
    imports its parents (``matplotlib_inline.backend_inline`` imports
    matplotlib, a third of a second at every kernel start).  The server reports
    a listed module that then fails to import (:attr:`ForkServer.failed`).
    """
    found = []
    for name in DEFAULT_PRELOAD:
        top = name.partition(".")[0]
        try:
            if top in sys.modules or find_spec(top) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return found


def _site_fingerprint() -> tuple[tuple[str, float], ...]:
    """The modification times of this Python's site directories: a package installed or removed changes one."""
    directories = [*site.getsitepackages(), site.getusersitepackages() if site.ENABLE_USER_SITE else ""]
    found = []
    for directory in dict.fromkeys(filter(None, directories)):
        try:
            found.append((directory, os.stat(directory).st_mtime))
        except OSError:
            found.append((directory, 0.0))
    return tuple(found)


class _Server:
    """One started server process: its sandbox run, its socket, its state."""

    def __init__(self, preload: Sequence[str], task: TaskDirectory, spare: bool, warm: str | None) -> None:
        from .sandbox import start  # the core imports this module's type only

        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ready = threading.Event()
        self.hello: dict[str, Any] = {}
        self.outcome: Outcome | None = None
        self.in_flight = 0
        self.retired = False
        self.fingerprint = _site_fingerprint()
        # The pids cgroup the server's spare command joins ahead of its run.
        self.spare_cgroup = _new_cgroup() if spare else None
        config = {"preload": list(preload), "fd": 3, "spare": spare, "warm": warm}
        config["cgroup"] = str(self.spare_cgroup.path) if self.spare_cgroup else None
        try:
            self.run = start(
                [sys.executable, "-m", "cellbox._forkserver_child", json.dumps(config)],
                limits=_server_limits(),
                task=task,
                pass_fds={theirs.fileno(): 3},
            )
        except BaseException:
            self.sock.close()
            self._drop_cgroup()
            raise
        finally:
            theirs.close()
        self.thread = threading.Thread(target=self._watch, name="cellbox-forkserver", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        """Wait for the server's ``ready``, then for its end."""
        self.sock.settimeout(READY_TIMEOUT)
        try:
            data = self.sock.recv(1024 * 1024)
            hello = json.loads(data) if data else {}
            if hello.get("event") == "ready":
                self.hello = hello
                self.ready.set()
        except (OSError, ValueError):
            pass
        self.outcome = self.run.wait()
        self.ready.clear()

    @property
    def alive(self) -> bool:
        return self.outcome is None

    def hand_off(self, request: dict[str, Any], fds: Sequence[int], timeout: float) -> tuple[int, _PidsCgroup | None]:
        """Send one run; return its supervisor's pid and the cgroup its command is in.  Raises ForkServerError.

        With a spare cgroup, the run gets it (its ``pids.max`` set to the run's
        limit before the spare is told to run), and the next spare a new one.
        """
        cgroup, following = self.spare_cgroup, None
        if cgroup is not None:
            try:
                (cgroup.path / "pids.max").write_text(str(request["limits"]["processes"]))
                following = _new_cgroup()
            except OSError as exc:
                raise ForkServerError(f"the spare's pids cgroup is gone ({exc.strerror})") from None
            request = dict(request, cgroup=str(cgroup.path), next_cgroup=str(following.path) if following else None)
        self.sock.settimeout(timeout)
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
            data = self.sock.recv(65536)
        except OSError as exc:
            if following is not None:
                following.remove()
            raise ForkServerError(f"the hand-off failed ({exc.strerror or type(exc).__name__})") from None
        reply = json.loads(data) if data else {"error": "the server closed its socket"}
        if "pid" not in reply:
            if following is not None:
                following.remove()
            raise ForkServerError(str(reply.get("error")))
        self.spare_cgroup = following
        return int(reply["pid"]), cgroup

    def _drop_cgroup(self) -> None:
        cgroup, self.spare_cgroup = self.spare_cgroup, None
        if cgroup is not None:
            cgroup.remove()  # kills a spare still in it

    def stat(self, timeout: float) -> dict[str, Any]:
        self.sock.settimeout(timeout)
        socket.send_fds(self.sock, [json.dumps({"op": "stat"}).encode()], [])
        return dict(json.loads(self.sock.recv(65536)))

    def close(self) -> None:
        """End the server: its launcher kills it and every spare it forked."""
        self.retired = True
        self.ready.clear()
        try:
            self.sock.close()
        except OSError:
            pass
        self.run.kill()
        self._drop_cgroup()


def _new_cgroup() -> _PidsCgroup | None:
    """A new pids cgroup for a spare to join ahead of its run, or ``None`` where the core has none (not root)."""
    from .sandbox import _PidsCgroup, pids_cgroup_root

    root = pids_cgroup_root()
    if root is None:
        return None
    try:
        return _PidsCgroup(root, _server_limits().processes)
    except OSError:
        return None


def _last_line(server: _Server) -> str:
    """What a server that died said last, or how it ended."""
    outcome = server.outcome
    if outcome is None:
        return "it is not running"
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"it ended with status {outcome.status.value}"


def _server_limits() -> Limits:
    """The server's own limits: roomy, because a run can only lower what it inherits (setrlimit(2))."""
    _soft, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _soft, fsize = resource.getrlimit(resource.RLIMIT_FSIZE)
    big = 2**62
    return Limits(
        wall_time=float(10**9),
        cpu_time=float(10**7),
        memory=None,
        output=1024**2,
        file_size=big if fsize == resource.RLIM_INFINITY else fsize,
        open_files=65536 if nofile == resource.RLIM_INFINITY else nofile,
        processes=4096,
        nice=19,
        io_class="idle",
    )


class ForkServer:
    """A warm parent for the runs of one kernel session or grading worker.

    Args:
        preload: modules the server imports (default :func:`default_preload`);
            a module that fails to import is listed in :attr:`failed`.
        task: the task directory whose ``home/`` and ``tmp/`` the server's
            environment names (the runs' own environments are set per run).
        spare: keep a supervisor and command pair forked ahead of time (faster;
            ``False`` forks on demand).
        warm: the module whose ``warm_start()`` each spare calls while it waits
            (default :mod:`cellbox.cellrunner` when preloaded: the spare builds
            the next cell's IPython shell ahead of time); ``None`` for none.
        handoff_timeout: seconds a hand-off may take before the run is spawned.

    Start it with :meth:`start` (returns at once; the server imports in the
    background), or leave it to the first run: that one is spawned and the
    server starts when it ends, so a kernel's first result is not slowed by the
    server's imports on a small machine.  End it with :meth:`close`.
    Thread-safe: hand-offs are serialised by a lock.  Runs that come before the
    server is ready are spawned.
    """

    def __init__(
        self,
        preload: Sequence[str] | None = None,
        *,
        task: TaskDirectory | None = None,
        spare: bool = True,
        warm: str | None = "cellbox.cellrunner",
        handoff_timeout: float = HANDOFF_TIMEOUT,
    ) -> None:
        self.preload = list(default_preload() if preload is None else preload)
        self.warm = warm if warm in self.preload else None
        self._own_task = task is None
        self.task = task or TaskDirectory.create(prefix="cellbox-forkserver-")
        self.spare = spare
        self.handoff_timeout = handoff_timeout
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._retired: list[_Server] = []
        self.restarts = 0
        self.closed = False
        self._wanted = False
        self.broken: str | None = None
        self.last_error: str | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> ForkServer:
        """Start the server process if it is not running (returns at once)."""
        with self._lock:
            self._ensure()
        return self

    def _ensure(self) -> _Server | None:
        """The running server, started or replaced when needed; ``None`` once it has proved unable to start."""
        server = self._server
        if self.broken is not None:
            return None
        if server is not None and server.alive and server.fingerprint == _site_fingerprint():
            return server
        if server is not None:
            self._retire(server)
            self._server = None
            if not server.alive and not server.hello:
                # It died before it was ready: starting it again for every run would
                # only cost each run a server's start.  Runs are spawned from now on.
                self.broken = _last_line(server)
                return None
            self.restarts += 1
        try:
            self._server = _Server(self.preload, self.task, self.spare, self.warm)
        except (OSError, RuntimeError) as exc:
            # A cell may have removed the task directory (the kernel makes it again
            # before the next cell): try again when the next spawned run ends.
            self.last_error = str(exc)
            return None
        return self._server

    def _retire(self, server: _Server) -> None:
        """Stop a server now, or when its last run ends: killing it would kill the runs forked from it."""
        server.retired = True
        server.ready.clear()
        if server.in_flight == 0:
            server.close()
        else:
            self._retired.append(server)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """Start the server if needed and wait until it has imported its preload list; ``False`` on timeout."""
        server = self.start()._server
        return server is not None and server.ready.wait(timeout)

    def close(self) -> None:
        """Stop the server and its spare (runs still going are left to end)."""
        with self._lock:
            self.closed = True
            if self._server is not None:
                self._retire(self._server)
                self._server = None
        if self._own_task and not self._retired:
            self.task.remove()

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ facts

    @property
    def pid(self) -> int | None:
        """The server process's pid, once it is ready."""
        server = self._server
        return int(server.hello["pid"]) if server is not None and server.ready.is_set() else None

    @property
    def launcher_pid(self) -> int | None:
        """The pid of the launcher that supervises the server (every forked run descends from it)."""
        server = self._server
        return server.run.proc.pid if server is not None else None

    @property
    def loaded(self) -> list[str]:
        """The preload modules the server imported."""
        return list(self._server.hello.get("loaded", [])) if self._server else []

    @property
    def failed(self) -> dict[str, str]:
        """Preload modules that could not be imported, with why."""
        return dict(self._server.hello.get("failed", {})) if self._server else {}

    def memory(self) -> dict[str, int]:
        """The server's ``vm_size`` and ``rss`` now, bytes (from its /proc/self/statm).

        Raises:
            ForkServerError: the server is not ready.
        """
        with self._lock:
            server = self._server
            if server is None or not server.ready.is_set():
                raise ForkServerError("the fork server is not ready")
            try:
                return {k: int(v) for k, v in server.stat(self.handoff_timeout).items()}
            except (OSError, ValueError) as exc:
                raise ForkServerError(f"the fork server did not answer ({exc})") from None

    # ------------------------------------------------------------------ runs

    def refusal(self, argv: Sequence[str], limits: Limits, layers: Sequence[str]) -> str | None:
        """Why a run must be spawned instead (``""`` when it need not be said), or ``None`` to fork it."""
        if self.closed:
            return "the fork server is closed"
        if len(argv) < 3 or argv[1] != "-m" or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
            return ""  # not a Python module entry point: spawned, as asked
        wrapped = set(layers) & set(BWRAP_LAYERS)
        if wrapped:
            return f"the {', '.join(sorted(wrapped))} isolation layers need a spawned launcher"
        with self._lock:
            if self._server is None and self.broken is None:
                # Not started yet: this run is spawned, and the server starts when it
                # ends (see spawned), so its imports do not slow the first result.
                self._wanted = True
                return ""
            server = self._ensure()
            if server is None:
                return f"the fork server could not start ({self.broken or self.last_error})"
            if not server.ready.is_set():
                return ""  # still importing: this run is spawned, the next one forked
            size = int(server.hello.get("vm_size", 0))
        if limits.memory is not None and limits.memory < size + MEMORY_HEADROOM:
            return "the memory limit is too close to the fork server's own size"
        return None

    def spawned(self) -> None:
        """Called by the core when a run it spawned instead ends: start the server if that run wanted it."""
        with self._lock:
            if self._wanted and self._server is None and not self.closed:
                self._ensure()

    def hand_off(self, request: dict[str, Any], fds: Sequence[int]) -> tuple[int, Any, _PidsCgroup | None]:
        """Give a run to the server: ``(supervisor pid, release, cgroup)``; call ``release()`` when the run ends.

        ``cgroup`` is the pids cgroup the run's command is in when the spare
        joined one ahead of time (the caller owns it from then on, and removes
        it when the run ends), else ``None`` (the request's own is used).

        Raises:
            ForkServerError: the server is gone, refused, or did not answer within
                :attr:`handoff_timeout` seconds (it is then restarted for the next run).
        """
        with self._lock:
            server = self._ensure()
            if server is None or not server.ready.is_set():
                raise ForkServerError("the fork server is not ready")
            try:
                pid, cgroup = server.hand_off(request, fds, self.handoff_timeout)
            except ForkServerError:
                self._retire(server)  # a server that failed once is not trusted again
                self._server = None
                raise
            server.in_flight += 1
        return pid, lambda: self._release(server), cgroup

    def _release(self, server: _Server) -> None:
        with self._lock:
            server.in_flight -= 1
            if server.retired and server.in_flight == 0 and server in self._retired:
                self._retired.remove(server)
                server.close()
