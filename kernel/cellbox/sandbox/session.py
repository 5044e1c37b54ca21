"""The session: a keeper and a chain of snapshots, inside one sandbox, that every run is forked from.

A fresh interpreter per run costs tens of milliseconds, and far more when the
run imports IPython or numpy; carrying a kernel's state by pickles loses what
cannot be pickled and costs more the bigger the state.  A :class:`ForkServer`
keeps one **session** per kernel (see :mod:`cellbox.sandbox.keeper` for the
child side): a trusted keeper that has imported a preload list (for the kernel:
the cell runner, IPython, numpy), a base snapshot forked from it with IPython's shell built, and, with
``carry=True``, a chain of snapshots, each the process image of a cell that
finished, which the next cell is forked from.  It sits behind the sandbox
core's API::

    server = ForkServer(preload, warm="cellbox.kernel.cellrunner", task=task, isolation=Isolation.auto(),
                        cwd=notebook_dir, carry=True)
    run = start([sys.executable, "-m", "cellbox.kernel.cellrunner", spec], forkserver=server, task=task)
    outcome = run.wait()
    server.settle(keep=outcome.status is Status.OK)

Every run still starts as a fresh process, under its own limits, with the
scrubbed environment, supervised and killed by the keeper, which no run can
signal, trace or read (the keeper is not dumpable, and sits outside the
Landlock domain that the snapshots and runs share).  The session's isolation
(namespaces, user, Landlock) is set up once, when the session starts, and
every run of it is inside.

A run goes to the session only when it can be run there as a spawn would run
it; otherwise (see :meth:`ForkServer.refusal`) it is spawned, and when the
session fails it is spawned with a note:

* the command must be ``[sys.executable, "-m", MODULE, ...]``;
* the run's isolation layers are the session's;
* the session is ready and not busy with another run;
* the session's environment is unchanged: a package installed or removed since
  it started (a changed site directory) starts a new session first, which for
  a kernel means its state is lost (it says so).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import site
import socket
import sys
import threading
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

from .cgroups import UNBOUNDED_MEMORY, MemoryCgroup
from .environment import TaskDirectory, build_environment
from .importpath import KEEPER_FLAGS
from .isolation import BWRAP_LAYERS, Isolation, landlock_rules, make_plan, probe
from .limits import DEFAULT_CEILING, Limits, format_size
from .outcome import Outcome
from .runs import ForkServerError, start

__all__ = ["ForkServer", "ForkServerError", "installed", "START_METHODS"]

START_METHODS = ("spawn", "forkserver")
# Bytes of address space a pristine forked run needs beyond the base's own before
# its memory limit is worth forking under (RLIMIT_AS counts what it inherited).
MEMORY_HEADROOM = 128 * 1024**2
# Seconds a hand-off may take before the run is spawned instead.
HANDOFF_TIMEOUT = 5.0
# Seconds a session's launcher gets to kill everything in it and report, when it is closed.
CLOSE_TIMEOUT = 5.0
# Seconds the session may take to import its preload list and build its shell.
READY_TIMEOUT = 120.0
# The layers a session is set up with once; a run's Landlock layer is the session's.
SESSION_LAYERS = (*BWRAP_LAYERS, "landlock")


def installed(names: Sequence[str]) -> list[str]:
    """``names`` without the modules whose top-level package is not installed; nothing is imported.

    Only top-level packages are looked up: ``find_spec`` of a dotted name
    imports its parents.  The keeper reports a listed module that then fails to
    import (:attr:`ForkServer.failed`).
    """
    found = []
    for name in names:
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


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What a session is started with: its preload, its sandbox, its chain."""

    preload: tuple[str, ...]
    warm: str | None
    task: TaskDirectory
    isolation: Isolation
    cwd: str
    undo_depth: int
    beside: tuple[str, ...] = ()
    ceiling: Limits = DEFAULT_CEILING
    memory: int | None = None


class _Server:
    """One started session: its keeper's sandbox run, its socket, its state."""

    def __init__(self, setup: _Setup) -> None:

        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ready = threading.Event()
        self.hello: dict[str, Any] = {}
        self.outcome: Outcome | None = None
        self.retired = False
        self.busy = False
        self.fingerprint = _site_fingerprint()
        self.layers, config = _session_config(setup)
        keeper_isolation = dataclasses.replace(
            setup.isolation, layers=tuple(layer for layer in setup.isolation.layers if layer != "landlock")
        )
        try:
            self.run = start(
                # KEEPER_FLAGS: nothing of the folder it starts in (the notebook's) or of its home (the
                # task's home/, which cells write) is imported by the keeper or the snapshots it forks.
                [sys.executable, *KEEPER_FLAGS, "-m", "cellbox.sandbox.keeper", json.dumps(config)],
                limits=_server_limits(setup.ceiling, setup.memory),
                task=setup.task,
                cwd=setup.cwd,
                pass_fds={theirs.fileno(): 3},
                isolation=keeper_isolation,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self.thread = threading.Thread(target=self._watch, name="cellbox-session", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        """Wait for the keeper's ``ready``, then for its end."""
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

    def ask(self, request: dict[str, Any], fds: Sequence[int], timeout: float) -> dict[str, Any]:
        """One request and its reply, read after those still owed to :meth:`tell`.  Raises ForkServerError."""
        self.sock.settimeout(timeout)
        try:
            self._take_owed()
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
            data = self.sock.recv(65536)
        except OSError as exc:
            raise ForkServerError(f"the session did not answer ({exc.strerror or type(exc).__name__})") from None
        if not data:
            raise ForkServerError("the session closed its socket")
        reply = dict(json.loads(data))
        if "error" in reply:
            raise ForkServerError(str(reply["error"]))
        return reply

    def tell(self, request: dict[str, Any], timeout: float) -> None:
        """Send a request without waiting for its reply; the next :meth:`ask` reads it.  Raises ForkServerError.

        The keeper answers every request in order, one reply each, so a reply
        left in the socket is read, and dropped, before the next one's.
        """
        self.sock.settimeout(timeout)
        try:
            self._take_owed()
            socket.send_fds(self.sock, [json.dumps(request).encode()], [])
        except OSError as exc:
            raise ForkServerError(f"the session did not answer ({exc.strerror or type(exc).__name__})") from None
        self.owed += 1

    owed = 0  # replies of tell()'s requests not read yet

    def _take_owed(self) -> None:
        while self.owed:
            if not self.sock.recv(65536):
                raise ForkServerError("the session closed its socket")
            self.owed -= 1

    def close(self) -> None:
        """End the session: its launcher kills the keeper, every snapshot and every run, then reports.

        Returns once it has reported (or after the launcher's grace), so that
        nothing of the session outlives a kernel's shutdown.
        """
        self.retired = True
        self.ready.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        except OSError:
            pass
        self.run.kill()
        if threading.current_thread() is not self.thread:
            self.thread.join(CLOSE_TIMEOUT)


def _is_this_python(program: str) -> bool:
    """Whether ``program`` is this interpreter: ``sys.executable`` itself (as the kernel names it for every cell,
    with no lookup), or a path that resolves to the same file."""
    return program == sys.executable or os.path.realpath(program) == os.path.realpath(sys.executable)


def _session_config(setup: _Setup) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The layers the session gets, and the keeper's configuration (its Landlock rules for the snapshots)."""
    support = probe()
    plan = make_plan(setup.isolation, support, user=None) if setup.isolation.wanted else None
    layers = tuple(plan.layers) if plan is not None else ()
    config: dict[str, Any] = {"preload": list(setup.preload), "fd": 3, "warm": setup.warm}
    config.update(undo_depth=setup.undo_depth, ready_timeout=READY_TIMEOUT)
    if plan is not None and "landlock" in plan.layers:
        path = build_environment(setup.task)["PATH"]
        config["landlock"] = landlock_rules(
            setup.isolation, plan, programs=[sys.executable], cwd=setup.cwd, task=str(setup.task.path), path=path
        )
    return layers, config


def _last_line(server: _Server) -> str:
    """What a session that died said last, or how it ended."""
    outcome = server.outcome
    if outcome is None:
        return "it is not running"
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"it ended with status {outcome.status.value}"


# Tasks of the session's own (the keeper, its snapshots and spares, their threads) beyond a run's processes.
SESSION_TASKS = 64


def _server_limits(ceiling: Limits = DEFAULT_CEILING, memory: int | None = None) -> Limits:
    """The session's own limits: its hard rlimits are the ceiling of every run in it (a run forked there keeps
    soft limits only, and may raise them up to these: setrlimit(2)); its ``/tmp`` and ``/dev/shm`` are tmpfs of
    the ceiling's ``shared_memory``; ``memory`` bytes bound the whole session (its memory cgroup, where one is
    writable: every run, snapshot and tmpfs page together)."""
    _soft, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _soft, fsize = resource.getrlimit(resource.RLIMIT_FSIZE)
    return Limits(
        wall_time=float(10**9),
        # The keeper holds each run to its own CPU limit (keeper.py); RLIMIT_CPU would count the keeper's life.
        cpu_time=float(10**7),
        memory=ceiling.memory,
        output=1024**2,
        file_size=ceiling.file_size if fsize == resource.RLIM_INFINITY else min(fsize, ceiling.file_size),
        shared_memory=ceiling.shared_memory,
        open_files=ceiling.open_files if nofile == resource.RLIM_INFINITY else min(nofile, ceiling.open_files),
        processes=ceiling.processes + SESSION_TASKS,
        resident=memory,
        # The keeper alone keeps the kernel's priority: it is on the way of every run (hand-off, reaping,
        # report), and at 19 each of those hops waited for the machine's other work. Its snapshots
        # lower theirs to SNAPSHOT_NICE, so runs still start from there (snapshots.start_base).
        nice=0,
        io_class="idle",
    )


class ForkServer:
    """A session of warm, sandboxed processes that the runs of one kernel (or test) are forked from.

    Args:
        preload: modules the keeper imports (see :func:`installed`); a module
            that fails to import is listed in :attr:`failed`.
        task: the task directory whose ``home/`` and ``tmp/`` the session's
            environment names (the runs' own environments are set per run).
        isolation: the session's sandbox (:class:`~cellbox.sandbox.isolation.Isolation`),
            set up once for the keeper, its snapshots and every run; runs that
            ask for other layers are spawned.  Default: none.
        cwd: the directory the session's view shows writable (a kernel's notebook
            directory); default: the task directory's ``work/``.
        carry: each cell-runner run (the ``warm`` module) is forked from the
            latest kept snapshot and leaves a new one (see :meth:`settle`);
            other runs are always forked from the pristine base.
        undo_depth: kept snapshots beyond the current one, for :meth:`undo`.
        beside: entry modules of runs **beside** the state (with ``carry=True``): each is forked from the
            latest kept snapshot, as a cell is, and leaves none (it is discarded); the next cell's
            spare is kept for it.  The kernel answers completion and inspection so.
        warm: the runs' entry module, when preloaded: the keeper imports it first and calls its
            ``prepare_process()``, the base snapshot calls its ``warm_start()``, and every run
            of it starts from its code already compiled (the kernel's cell runner builds
            IPython's shell there).
        handoff_timeout: seconds a hand-off may take before the run is spawned.
        ceiling: the most any run of the session may be given (:class:`~cellbox.sandbox.limits.Limits`): the
            session's hard rlimits, and the size of its ``/tmp`` and ``/dev/shm`` (``shared_memory``).  A
            caller that gives runs more than this must lower them first (the kernel caps ``%%limits``).
        memory: bytes the whole session may hold (a memory cgroup, where writable), or ``None`` for no bound.

    Start it with :meth:`start` (returns at once; the keeper imports in the
    background) and :meth:`wait_ready`, or leave it to the first run: that one
    is spawned and the session starts when it ends.  End it with :meth:`close`.
    Thread-safe; one run at a time (a run that comes while another is going is
    spawned).
    """

    def __init__(
        self,
        preload: Sequence[str] = (),
        *,
        task: TaskDirectory | None = None,
        isolation: Isolation | None = None,
        cwd: str | os.PathLike[str] | None = None,
        carry: bool = False,
        undo_depth: int = 0,
        warm: str | None = None,
        handoff_timeout: float = HANDOFF_TIMEOUT,
        beside: Sequence[str] = (),
        ceiling: Limits = DEFAULT_CEILING,
        memory: int | None = None,
    ) -> None:
        names = tuple(preload)
        self._own_task = task is None
        self.task = task or TaskDirectory.create(prefix="cellbox-forkserver-")
        self.setup = _Setup(
            preload=names,
            warm=warm if warm in names else None,
            task=self.task,
            isolation=isolation or Isolation(mode="none"),
            cwd=os.path.abspath(cwd if cwd is not None else self.task.work),
            undo_depth=max(0, int(undo_depth)),
            beside=tuple(beside),
            ceiling=ceiling,
            memory=memory,
        )
        self.carry = carry
        self.handoff_timeout = handoff_timeout
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._retired: list[_Server] = []
        self.restarts = 0
        self.closed = False
        self._wanted = False
        self.broken: str | None = None
        self.last_error: str | None = None
        self.lost: str | None = None

    @property
    def preload(self) -> list[str]:
        return list(self.setup.preload)

    @property
    def warm(self) -> str | None:
        return self.setup.warm

    # ------------------------------------------------------------------ life

    def start(self) -> ForkServer:
        """Start the session if it is not running (returns at once)."""
        with self._lock:
            self._ensure()
        return self

    def _ensure(self) -> _Server | None:
        """The running session, started or replaced when needed; ``None`` once it has proved unable to start."""
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
                # only cost each run a session's start.  Runs are spawned from now on.
                self.broken = _last_line(server)
                return None
            self.restarts += 1
            ended = f"the session ended ({_last_line(server)})"
            self.lost = "a package was installed or removed" if server.alive else ended
        try:
            self._server = _Server(self.setup)
        except (OSError, RuntimeError) as exc:
            # A cell may have removed the task directory (the kernel makes it again
            # before the next cell): try again when the next spawned run ends.
            self.last_error = str(exc)
            return None
        return self._server

    def _retire(self, server: _Server) -> None:
        """Stop a session now, or when its run ends: killing it would kill the run."""
        server.retired = True
        server.ready.clear()
        if not server.busy:
            server.close()
        else:
            self._retired.append(server)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """Start the session if needed and wait until its base snapshot is ready; ``False`` on timeout."""
        server = self.start()._server
        return server is not None and server.ready.wait(timeout)

    def close(self) -> None:
        """Stop the session (its keeper, snapshots and any run still going)."""
        with self._lock:
            self.closed = True
            servers = [*self._retired, *([self._server] if self._server is not None else [])]
            self._server = None
            self._retired = []
        for server in servers:
            server.close()
        if self._own_task:
            self.task.remove()

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ facts

    @property
    def pid(self) -> int | None:
        """The keeper's pid as the session sees it (its own pid namespace's, with the pid layer), once ready."""
        server = self._server
        return int(server.hello["pid"]) if server is not None and server.ready.is_set() else None

    @property
    def launcher_pid(self) -> int | None:
        """The pid of the launcher that supervises the session (every run of it descends from it)."""
        server = self._server
        return server.run.proc.pid if server is not None else None

    @property
    def layers(self) -> tuple[str, ...]:
        """The isolation layers the session's runs are inside."""
        server = self._server
        return server.layers if server is not None else ()

    @property
    def notes(self) -> list[str]:
        """What the session could not set up (a Landlock domain the kernel refused, its memory bound), for the runs'
        notes."""
        server = self._server
        landlock = server.hello.get("landlock") if server is not None else None
        notes = [str(landlock)] if landlock else []
        if server is not None and self.setup.memory is not None and server.run._memory_cgroup is None:
            # Said with every run (a kernel shows it once, on the first cell): the bound it was given does not hold.
            notes.append(
                f"memory: the session's bound of {format_size(self.setup.memory)} does not hold: {UNBOUNDED_MEMORY}"
            )
        return notes

    @property
    def cgroup_layers(self) -> list[str]:
        """``["pids-cgroup"]`` when the session's runs are counted in its pids cgroup (its processes limit)."""
        server = self._server
        return ["pids-cgroup"] if server is not None and server.hello.get("cgroup") else []

    @property
    def memory_cgroup(self) -> MemoryCgroup | None:
        """The session's memory cgroup (every run, snapshot and tmpfs page of it), or ``None`` without one."""
        server = self._server
        return server.run._memory_cgroup if server is not None else None

    @property
    def loaded(self) -> list[str]:
        """The preload modules the keeper imported."""
        return list(self._server.hello.get("loaded", [])) if self._server else []

    @property
    def failed(self) -> dict[str, str]:
        """Preload modules that could not be imported, with why."""
        return dict(self._server.hello.get("failed", {})) if self._server else {}

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            server = self._server
            if server is None or not server.ready.is_set():
                raise ForkServerError("the session is not ready")
            return server.ask(request, [], self.handoff_timeout)

    def memory(self) -> dict[str, Any]:
        """The keeper's ``vm_size`` and ``rss`` (bytes), and ``snapshots``: each one's pid, ``rss`` and ``pss``.

        Raises:
            ForkServerError: the session is not ready or did not answer.
        """
        return self._request({"op": "stat"})

    def settle(self, keep: bool, wait: bool = True, kind: str = "cell") -> dict[str, Any]:
        """Keep the snapshot the last run left as the current state (``keep``), or drop it.

        ``kind`` says what made it: a ``"cell"``, or a ``"comm"`` run (a
        frontend's comm message), whose state replaces a comm run's on top of
        the chain (:func:`cellbox.sandbox.snapshots.keep_state`: ``undo``
        counts cells, not widget events).

        Returns ``{"kept": bool, "depth": kept snapshots, "rss": bytes}`` (the
        current snapshot's resident size), or ``{}`` when there is no session.
        With ``wait=False`` it returns ``{}`` at once, without the keeper's
        answer: a kernel takes these facts from the run's exit record
        (:attr:`cellbox.sandbox.Run.settle_facts`) and replies to its client
        while the keeper settles.
        """
        request = {"op": "settle", "keep": bool(keep), "kind": "comm" if kind == "comm" else "cell"}
        try:
            if wait:
                return self._request(request)
            with self._lock:
                server = self._server
                if server is None or not server.ready.is_set():
                    return {}
                server.tell(request, self.handoff_timeout)
        except ForkServerError:
            pass
        return {}

    def let_go(self, count: int = 1) -> dict[str, Any]:
        """Kill the ``count`` oldest snapshots kept for :meth:`undo`, never the current state, to give their memory
        back; ``count`` 0 kills none.

        Returns ``{"let_go": how many, "depth": kept snapshots left}`` once
        those and every snapshot let go before (by :meth:`settle`, say) have
        exited, or after the keeper's ``LET_GO_TIMEOUT`` (5 seconds).  ``undo``
        stops above the base once one was let go.

        Raises:
            ForkServerError: the session is not ready or did not answer.
        """
        return self._request({"op": "let_go", "n": int(count)})

    def undo(self, count: int = 1) -> dict[str, Any]:
        """Drop the ``count`` newest kept snapshots: the state goes back to before those cells.

        Returns ``{"undone": how many, "depth": kept snapshots left}``.

        Raises:
            ForkServerError: the session is not ready or did not answer.
        """
        return self._request({"op": "undo", "n": int(count)})

    # ------------------------------------------------------------------ runs

    def refusal(self, argv: Sequence[str], limits: Limits, layers: Sequence[str]) -> str | None:
        """Why a run must be spawned instead (``""`` when it need not be said), or ``None`` to fork it."""
        if self.closed:
            return "the fork server is closed"
        if len(argv) < 3 or argv[1] != "-m" or not _is_this_python(argv[0]):
            return ""  # not a Python module entry point: spawned, as asked
        with self._lock:
            if self._server is None and self.broken is None:
                # Not started yet: this run is spawned, and the session starts when it
                # ends (see spawned), so its imports do not slow the first result.
                self._wanted = True
                return ""
            server = self._ensure()
            if server is None:
                return f"the fork server could not start ({self.broken or self.last_error})"
            if not server.ready.is_set() or server.busy:
                return ""  # still importing, or busy: this run is spawned
            wanted = {layer for layer in layers if layer in SESSION_LAYERS}
            have = {layer for layer in server.layers if layer in SESSION_LAYERS}
            size = int(server.hello.get("vm_size", 0))
        if wanted != have:
            return f"the run's isolation ({', '.join(sorted(wanted)) or 'none'}) is not the session's"
        carried = self.carry and (argv[2] == self.setup.warm or argv[2] in self.setup.beside)
        # A pristine run starts with the base's address space, which RLIMIT_AS counts. A carried
        # cell holds the session's state too: a limit below it is that cell's memory_limit.
        if not carried and limits.memory is not None and limits.memory < size + MEMORY_HEADROOM:
            return "the memory limit is too close to the fork server's own size"
        return None

    def spawned(self) -> None:
        """Called by the core when a run it spawned instead ends: start the session if that run wanted it."""
        with self._lock:
            if self._wanted and self._server is None and not self.closed:
                self._ensure()

    def hand_off(self, request: dict[str, Any], fds: Sequence[int]) -> tuple[int, Any, None]:
        """Give a run to the session: ``(command pid, release, None)``; call ``release()`` when the run ends.

        The pid is the command's in the session's own pid namespace (with the
        pid layer), so the caller never signals it: the keeper does.

        Raises:
            ForkServerError: the session is gone, busy, refused, or did not answer
                within :attr:`handoff_timeout` seconds (it is then replaced).
        """
        carried = self.carry and request["argv"][2] == self.setup.warm
        beside = self.carry and request["argv"][2] in self.setup.beside
        # The session decided the user, the namespaces, the Landlock domain (or the signal scope) and
        # the pids cgroup once, for all its runs: a domain per run would nest deeper at every cell.
        request = {
            k: v for k, v in request.items() if k not in ("uid", "gid", "groups", "user", "landlock", "signal_scope")
        }
        request.update(snapshot=carried, cgroup=None, beside=beside)
        request["from"] = "current" if carried or beside else "base"
        request["op"] = "run"
        with self._lock:
            server = self._ensure()
            if server is None or not server.ready.is_set():
                raise ForkServerError("the session is not ready")
            if server.busy:
                raise ForkServerError("the session is busy with another run")
            try:
                reply = server.ask(request, fds, self.handoff_timeout)
            except ForkServerError as exc:
                if "did not answer" in str(exc) or "closed" in str(exc):
                    self._retire(server)  # a session that failed to answer is not trusted again
                    self._server = None
                    self.restarts += 1  # the next run starts its replacement
                    self.lost = f"the session stopped answering ({exc})"
                raise
            server.busy = True
        return int(reply["pid"]), lambda: self._release(server), None

    def abandon(self) -> None:
        """End the session now (its keeper did not report a run in time); the next run starts a new one."""
        with self._lock:
            server, self._server = self._server, None
            if server is not None:
                self.lost = "the session stopped answering"
                self.restarts += 1
        if server is not None:
            server.close()

    def _release(self, server: _Server) -> None:
        with self._lock:
            server.busy = False
            if server.retired and server in self._retired:
                self._retired.remove(server)
                server.close()
