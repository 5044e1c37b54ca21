"""The sandbox core: run one command in a fresh child process under limits.

This is the parent side.  It starts ``_launch.py`` (stdlib only) in a new
session with a scrubbed environment; that launcher applies the limits in the
child before exec and supervises the command's process tree.  The parent keeps
the wall clock, reads stdout and stderr as a capped stream, obeys interrupts,
and turns what happened into an :class:`~cellbox.sandbox.outcome.Outcome`.

Safe to call from many threads at once: no Python code runs in the parent
between fork and exec (no ``preexec_fn``), and each :class:`Run` owns its pipes.

Typical use::

    outcome = run([sys.executable, "-c", "print(1)"], limits=Limits(wall_time=5))
    assert outcome.status is Status.OK

The kernel and the grader start children only through :func:`start` /
:func:`run`.  With ``forkserver=`` (a :class:`~cellbox.sandbox.session.ForkServer`)
a ``python -m MODULE`` run is forked from a warm server instead of spawned; the
pipes, the pump and the classification below are the same for both.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .cgroups import MemoryCgroup, PidsCgroup, pids_cgroup_root
from .classify import classify, ends_in_memory_error, failed_reservation, reservation_note
from .confinement import Confinement
from .environment import TaskDirectory, build_environment
from .isolation import (
    Isolation,
    Plan,
    landlock_abi,
    make_plan,
    probe,
)
from .limits import Limits, format_size
from .outcome import Outcome, Status
from .pump import KILL_GRACE, Pump

__all__ = [
    "run",
    "start",
    "Run",
    "SandboxError",
    "classify",
    "resolve_user",
    "pids_cgroup_root",
    "Isolation",
    "DEFAULT_ISOLATION",
]

LAUNCHER = str(Path(__file__).with_name("_launch.py"))
# Isolation when a caller does not choose: see docs/isolation.md for why.
DEFAULT_ISOLATION = Isolation(mode="none")
# Seconds an interrupted run gets to stop on SIGINT before it is killed.
INTERRUPT_GRACE = 1.0
# How the note of a run the session's memory cgroup killed begins (the kernel's words for the cell key on it).
SESSION_BOUND_NOTE = "memory: the session reached its memory bound"
# Where the channel's two pipes are in the command (message out, reply in).
CHANNEL_FDS = (3, 4)


class ForkServerError(RuntimeError):
    """A fork server could not take a run (it died, timed out, was busy or refused); the run is spawned instead."""


class ForkServer(Protocol):
    """What :func:`start` asks of a fork server (:class:`cellbox.sandbox.session.ForkServer` is the one).

    Declared here so the core never imports the session above it.
    """

    @property
    def notes(self) -> list[str]: ...

    @property
    def cgroup_layers(self) -> list[str]: ...

    @property
    def memory_cgroup(self) -> MemoryCgroup | None: ...

    def refusal(self, argv: Sequence[str], limits: Limits, layers: Sequence[str]) -> str | None: ...

    def spawned(self) -> None: ...

    def hand_off(self, request: dict[str, Any], fds: Sequence[int]) -> tuple[int, Any, Any]: ...

    def abandon(self) -> None: ...


class SandboxError(RuntimeError):
    """The sandbox could not start the run (an unknown user, a missing directory).

    The message is one sentence that says what was wrong and what to do.
    """


def resolve_user(user: str | int) -> tuple[int, int, list[int], str]:
    """Look up a user to run children as: ``(uid, gid, groups, name)``.

    Raises:
        SandboxError: the user does not exist, or this process cannot switch to it.
    """
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(f"no user {user!r} on this machine; give an existing user name or uid") from None
    if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
        raise SandboxError(f"running children as {entry.pw_name!r} needs root; leave out the user option")
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return entry.pw_uid, entry.pw_gid, groups, entry.pw_name


class _Stream:
    """One output stream: incremental UTF-8 decoding with replacement, and a callback."""

    def __init__(self, callback: Callable[[str], None] | None) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []
        self.callback = callback

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        if text:
            self.parts.append(text)
            if self.callback is not None:
                self.callback(text)

    def text(self) -> str:
        return "".join(self.parts)


class _Forked:
    """A run's supervisor forked by a fork server: the parts of ``subprocess.Popen`` the pump uses.

    It is not this process's child, so it is never waited for: its exit record
    on the status pipe (or its absence) says how it ended.
    """

    def __init__(
        self, pid: int, stdin: int | None, stdout: int, stderr: int, abandon: Callable[[], None] | None = None
    ) -> None:
        self.pid = pid  # in the session's pid namespace: never signalled from here
        self.stdin = os.fdopen(stdin, "wb", buffering=0) if stdin is not None else None
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.stderr = os.fdopen(stderr, "rb", buffering=0)
        self.returncode: int | None = None
        self._abandon = abandon

    def kill(self) -> None:
        """The session's keeper did not report: end the whole session (its launcher kills every process of it)."""
        if self.returncode is None and self._abandon is not None:
            self._abandon()
        self.returncode = -signal.SIGKILL


class Run(Confinement, Pump):
    """A started run.  Create with :func:`start`; finish with :meth:`wait`.

    :meth:`interrupt`, :meth:`kill` and :meth:`send` may be called from other
    threads while one thread is in :meth:`wait`.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        limits: Limits,
        cwd: str | os.PathLike[str] | None,
        env: Mapping[str, str] | None,
        stdin: bytes | str | None,
        task: TaskDirectory | None,
        on_stdout: Callable[[str], None] | None,
        on_stderr: Callable[[str], None] | None,
        on_message: Callable[[Any], None] | None,
        channel: bool,
        user: str | int | None,
        isolation: Isolation | None = None,
        forkserver: ForkServer | None = None,
        pass_fds: Mapping[int, int] | None = None,
    ) -> None:
        if not argv:
            raise SandboxError("nothing to run: the command is empty")
        self.limits = limits
        self._own_task = task is None
        self.task = task or TaskDirectory.create()
        self._lock = threading.Lock()
        self._parent_action: Status | None = None
        self._kill_at: float | None = None
        self._memory_error = False
        self._notes: list[str] = []
        self._isolation = ["rlimits", "environment-allowlist", "process-group", "subreaper"]
        self._on_message = on_message
        self._closing: list[int] = []
        self.isolation = isolation or DEFAULT_ISOLATION
        self._forkserver = forkserver
        self._release: Callable[[], None] | None = None
        self._pass_fds = dict(pass_fds or {})
        self._cgroup: PidsCgroup | None = None
        self._memory_cgroup: MemoryCgroup | None = None
        self._disk_watched = False
        self.start_method = "spawn"
        try:
            self._start(argv, cwd, env, stdin, on_stdout, on_stderr, channel, user)
        except BaseException:
            self._cleanup()
            raise

    # ------------------------------------------------------------------ start

    def _start(self, argv, cwd, env, stdin, on_stdout, on_stderr, channel, user) -> None:  # type: ignore[no-untyped-def]
        workdir = os.path.abspath(cwd if cwd is not None else self.task.work)
        self._workdir = workdir
        if not os.path.isdir(workdir):
            raise SandboxError(f"working directory {workdir} does not exist; create it or pass another")
        child_env = build_environment(self.task, extra=env)
        spec: dict[str, Any] = {"argv": list(map(str, argv)), "limits": self.limits.as_dict(), "cwd": workdir}
        plan = self._plan_isolation(user)
        user = plan.user if plan is not None else user
        if user is not None:
            uid, gid, groups, name = resolve_user(user)
            spec.update(uid=uid, gid=gid, groups=groups, user=name)
            self.task.open_to(uid, gid)
            self._isolation.append(f"user:{name}")
        # Kept at uid 0 by the user layer (keep_root), the command has none of root's capabilities.
        kept = plan is not None and "user" in plan.layers and plan.user is None and self.isolation.keep_root
        self.as_root = (spec.get("uid", os.geteuid())) == 0 and not kept
        # The command may not signal or ptrace its supervisor or this process, in every mode (Landlock ABI 6).
        spec["signal_scope"] = True
        if _signal_scope_available():
            self._isolation.append("signal-scope")
        self.proc: subprocess.Popen[bytes] | _Forked
        prefix: list[str] = []
        if self._forkserver is not None and self._forkable(argv, plan):
            # The session's sandbox holds the run: no namespaces, rules or cgroup of its own.
            self._isolation += [*(plan.layers if plan is not None else []), *self._forkserver.cgroup_layers]
            if os.geteuid() != 0:
                spec["nproc_extra"] = self.limits.processes
            self._note_session_wide_limits()
            self._session_memory = self._forkserver.memory_cgroup
            if self._session_memory is not None:
                self._session_ooms = self._session_memory.oom_kills()
        else:
            self._setup_processes_limit(spec)
            self._setup_resident_limit(spec)
            prefix = self._isolate(plan, spec, argv, child_env) if plan is not None else self._hold_walls(spec)
            self._note_disk_limit(spec, prefix)

        control_r, self._control_w = os.pipe()
        self._status_r, status_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        pass_fds = [control_r, status_w]
        child_side = [control_r, status_w]
        self._channel_r = self._reply_w = None
        self._channel = channel
        if channel:
            self._channel_r, msg_w = os.pipe()
            reply_r, self._reply_w = os.pipe()
            spec["fds"] = [[msg_w, CHANNEL_FDS[0]], [reply_r, CHANNEL_FDS[1]]]
            child_env["CELLBOX_CHANNEL"] = ",".join(map(str, CHANNEL_FDS))
            pass_fds += [msg_w, reply_r]
            child_side += [msg_w, reply_r]
        if self._pass_fds:
            spec["fds"] = [*spec.get("fds", []), *([s, t] for s, t in self._pass_fds.items())]
            pass_fds += list(self._pass_fds)
        spec.update(status_fd=status_w, control_fd=control_r)
        stdin_bytes = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            self.started = time.monotonic()
            self.deadline = self.started + self.limits.wall_time
            forked = self._fork(argv, plan, spec, child_env, stdin_bytes, child_side)
            if forked is None and self._respawn:
                # The session could not take it after all: set the run up to be spawned.
                dropped = [*(plan.layers if plan else []), "pids-cgroup"]
                self._isolation = [name for name in self._isolation if name not in dropped]
                spec.pop("nproc_extra", None)
                self._setup_processes_limit(spec)
                self._setup_resident_limit(spec)
                prefix = self._isolate(plan, spec, argv, child_env) if plan is not None else self._hold_walls(spec)
                self._note_disk_limit(spec, prefix)
            if forked is not None:
                self.proc = forked
                self._stdin_pending = stdin_bytes or b""
                self._streams = {"stdout": _Stream(on_stdout), "stderr": _Stream(on_stderr)}
                return
            # start_new_session is done by subprocess's C code (setsid), not by
            # Python code after fork, so this is safe in a threaded parent.
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-I", "-S", "-B", LAUNCHER, json.dumps(spec)],
                stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                start_new_session=True,
                env=child_env,
                cwd="/",
            )
        finally:
            for fd in child_side:
                os.close(fd)
        self._stdin_pending = stdin_bytes or b""
        self._streams = {"stdout": _Stream(on_stdout), "stderr": _Stream(on_stderr)}

    def _fork(
        self,
        argv: Sequence[str],
        plan: Plan | None,
        spec: dict[str, Any],
        env: dict[str, str],
        stdin_bytes: bytes | None,
        child_side: list[int],
    ) -> _Forked | None:
        """Hand the run to the fork server; ``None`` when it is to be spawned (a note says why, when it matters).

        ``child_side`` is ``[control_r, status_w, message_w, reply_r]`` (the
        channel's two only with a channel), as created for the launcher.
        """
        server = self._forkserver
        if server is None or not self._forked_ok:
            return None
        names = ["control", "status", "message", "reply"][: len(child_side)]
        ours: dict[str, int] = {}
        theirs = dict(zip(names, child_side, strict=True))
        try:
            ours["stdout"], theirs["stdout"] = os.pipe()
            ours["stderr"], theirs["stderr"] = os.pipe()
            if stdin_bytes is not None:
                theirs["stdin"], ours["stdin"] = os.pipe()
            request = {**spec, "env": env, "handoff": list(theirs)}
            request.pop("fds", None)
            pid, self._release, cgroup = server.hand_off(request, list(theirs.values()))
        except (ForkServerError, OSError) as exc:
            for fd in ours.values():
                os.close(fd)
            self._notes.append(f"forkserver: {exc}; the run was spawned")
            self._forked_ok = False
            self._respawn = True
            return None
        finally:
            for name, fd in theirs.items():
                if name in ("stdout", "stderr", "stdin"):
                    os.close(fd)
        if cgroup is not None:
            # The spare's command joined this one ahead of time: it replaces the run's own.
            if self._cgroup is not None:
                self._cgroup.remove_later()  # empty: nothing ever ran in it
            self._cgroup = cgroup
            if "pids-cgroup" not in self._isolation:
                self._isolation.append("pids-cgroup")
        self.start_method = "forkserver"
        self._isolation.append("forkserver")
        self._notes += server.notes
        return _Forked(pid, ours.get("stdin"), ours["stdout"], ours["stderr"], abandon=server.abandon)

    _forked_ok = False
    _respawn = False
    # Whether a session's run left a snapshot of itself (None: it was not asked to, or not forked).
    left_snapshot: bool | None = None
    # What settling that snapshot gives, from the keeper's exit record: {"keep": facts, "drop": facts}, each
    # {"depth": kept snapshots, "rss": the state's resident bytes} (see ForkServer.settle); empty when unknown.
    settle_facts: dict[str, Any] = {}
    # Why a session's run that finished its module left no snapshot (its fork refused), as its command said.
    snapshot_error: str | None = None
    # Whether the session's pids cgroup refused a fork or thread of the run (None: not known).
    _pids_refused: bool | None = None

    def _forkable(self, argv: Sequence[str], plan: Plan | None) -> bool:
        """Whether the fork server takes this run (a note says why not, when it matters)."""
        server = self._forkserver
        if server is None:
            return False
        refusal = server.refusal(argv, self.limits, plan.layers if plan is not None else ())
        if refusal is not None:
            if refusal:
                self._notes.append(f"forkserver: {refusal}; the run was spawned")
            self._release = server.spawned
            return False
        self._forked_ok = True
        return True

    def _plan_isolation(self, user: str | int | None) -> Plan | None:
        """Decide the run's isolation layers; in strict mode, refuse a missing one."""
        if not self.isolation.wanted:
            return None
        plan = make_plan(self.isolation, probe(), user=user)
        if self.isolation.mode == "strict" and plan.missing:
            layer, why = next(iter(plan.missing.items()))
            raise SandboxError(
                f"isolation is strict and the {layer} layer is not available here: {why} "
                "(see `cellbox doctor`, or use isolation auto)"
            )
        self._notes += plan.notes
        return plan

    # ------------------------------------------------------------------ control

    def _control(self, word: str) -> None:
        # The fds are None once wait() has cleaned up: an interrupt or kill from
        # another thread may come just after the run ended; there is nothing left to stop.
        control_w, wake_w = self._control_w, self._wake_w
        if control_w is None or wake_w is None:
            return
        try:
            os.write(control_w, word.encode() + b"\n")
        except OSError:
            pass  # the launcher is gone already
        try:
            os.write(wake_w, b"x")
        except OSError:
            pass

    def interrupt(self, grace: float = INTERRUPT_GRACE) -> None:
        """Send SIGINT to the command's process group; kill the tree after ``grace`` seconds.

        The run's status becomes ``interrupted`` (the parent's action comes first).
        """
        with self._lock:
            if self._parent_action is None:
                self._parent_action = Status.INTERRUPTED
            self._kill_at = time.monotonic() + grace
        self._control("interrupt")

    def move_deadline(self, seconds: float) -> None:
        """Move the wall-clock deadline ``seconds`` later (earlier when negative); thread-safe.

        The kernel stops a cell's wall clock while the cell waits for its user's
        answer (``input()``): the run's waiting loop reads the deadline at least
        once a second, and this wakes it at once.
        """
        with self._lock:
            self.deadline += seconds
        wake_w = self._wake_w
        if wake_w is not None:
            try:
                os.write(wake_w, b"x")
            except OSError:
                pass  # the run has ended

    def kill(self, reason: Status = Status.INTERRUPTED) -> None:
        """Kill the command and every process it started, now."""
        with self._lock:
            if self._parent_action is None:
                self._parent_action = reason
            if self._kill_at is None:
                self._kill_at = time.monotonic() + KILL_GRACE
        self._control("kill")

    def send(self, message: Any) -> None:
        """Write one JSON message to the child's channel (fd 4), for example an input reply.

        Raises:
            SandboxError: the run was not started with ``channel=True``.
        """
        if not self._channel:
            raise SandboxError("this run has no message channel; start it with channel=True")
        reply_w = self._reply_w
        if reply_w is None:
            return  # the run has ended and was cleaned up; nothing is waiting for the answer
        try:
            os.write(reply_w, (json.dumps(message) + "\n").encode())
        except OSError:
            pass  # the child is gone; nothing is waiting for the answer

    def add_output(self, name: str, text: str) -> None:
        """Output the child sent as a message instead of through a pipe (``"stdout"`` or ``"stderr"``).

        Call it in the thread that runs :meth:`wait` (an ``on_message`` callback):
        it is counted against the output limit and passed to ``on_stdout`` /
        ``on_stderr`` exactly as the pipes' output is.
        """
        if name in ("stdout", "stderr"):
            self._on_output(name, text.encode("utf-8", "replace"))

    def note_memory_error(self) -> None:
        """Record that the child reported an uncaught MemoryError over its channel."""
        self._memory_error = True

    # ------------------------------------------------------------------ reading

    def wait(self) -> Outcome:
        """Read the run to its end and return its :class:`Outcome`.  Call once."""
        try:
            record, exec_error = self._pump()
            self._reported = record is not None
            if isinstance(self.proc, _Forked) and record is not None:
                if "snapshot" in record:
                    self.left_snapshot = bool(record["snapshot"])
                if isinstance(record.get("settle"), dict):
                    self.settle_facts = record["settle"]
                if isinstance(record.get("snapshot_error"), str):
                    self.snapshot_error = record["snapshot_error"]
                if "pids_refused" in record:
                    self._pids_refused = bool(record["pids_refused"])
            if record is None and self._swept is None:
                self._sweep()
            if isinstance(self.proc, _Forked):
                # The session's keeper supervised it: its exit record came after it had
                # killed and reaped every process of the run; none means the session failed.
                wait_status = 0 if record is not None else signal.SIGKILL
                self.proc.returncode = 0 if record is not None else -signal.SIGKILL
            else:
                _pid, wait_status, _usage = os.wait4(self.proc.pid, 0)
                # Reaped: from here on its pid may belong to another process.
                self.proc.returncode = os.waitstatus_to_exitcode(wait_status)
            self._strip_setid_files()
            return self._outcome(record, exec_error, wait_status)
        finally:
            self._cleanup()

    def _sweep(self) -> None:
        """Kill what is left of a run whose supervisor ended without its exit record.

        Its processes are found by what they cannot leave without trying: the
        supervisor's session (the launcher's pid), the command's process group,
        the run's pids cgroup, and their descendants (proc(5): ``stat``
        fields 4, 5, 6).  A process that left all of these (``setsid`` in a
        double fork, as root a move out of the cgroup) cannot be told from
        any other, so the run's notes say processes may have escaped.  With the
        ``pid`` layer, the kernel has killed the namespace with its init.
        """
        if isinstance(self.proc, _Forked):
            # The session's keeper is the supervisor that failed: end the whole session,
            # whose launcher kills every process in it (its pid namespace, its cgroup).
            self.proc.kill()
            self._swept = 0
            self._notes.append(
                "the session's keeper did not report the run: the session was ended with every process in it"
            )
            return
        session = self.proc.pid
        group = self._command_pid if "pid" not in self._isolation else None
        killed: set[int] = set()
        for _ in range(50):
            cgroup = set(self._cgroup.pids()) if self._cgroup is not None else set()
            found = _run_processes(session, group, cgroup) - {os.getpid()}
            if not found:
                break
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            killed |= found
            time.sleep(0.01)
        self._swept = len(killed - {self.proc.pid})
        self._notes.append(
            f"the run's supervisor ended without reporting (killed, perhaps by the program): cellbox killed the "
            f"{self._swept} processes of the run it could still find; processes that left the run's session "
            "may have escaped"
        )

    def _force_kill(self) -> None:
        """The launcher did not finish in time: kill its group (the tree's own kill already ran)."""
        self._notes.append("the launcher did not report in time and was killed")
        if isinstance(self.proc, _Forked):
            # Its pid is the session's (another pid namespace): never signalled from
            # here. The session is ended instead, by its own launcher.
            self.proc.kill()
            return
        for target in (
            lambda: os.killpg(self.proc.pid, signal.SIGKILL),
            lambda: os.kill(self.proc.pid, signal.SIGKILL),
        ):
            try:
                target()
            except OSError:
                pass

    # ------------------------------------------------------------------ result

    truncated = False
    _reported = False  # the launcher sent its exit record: it killed the whole tree first
    _command_pid: int | None = None  # the command's pid (and group), as the supervisor reported it
    _swept: int | None = None  # processes killed by the parent after the supervisor was lost
    _session_memory: MemoryCgroup | None = None  # a forked run's session's memory cgroup
    _session_ooms = 0  # its OOM kills before the run

    def _outcome(self, record: dict[str, Any] | None, exec_error: str | None, wait_status: int) -> Outcome:
        wall = time.monotonic() - self.started
        stderr = self._streams["stderr"].text()
        if exec_error:
            stderr += f"cellbox: {exec_error}\n"
        if record is None:
            # The launcher itself was killed: report what its own wait status says.
            record = {"cpu": 0.0, "command_cpu": 0.0, "peak_kib": 0, "killed": 0}
            if os.WIFSIGNALED(wait_status):
                record["signal"] = os.WTERMSIG(wait_status)
            else:
                record["exit_code"] = os.WEXITSTATUS(wait_status)
        signum = record.get("signal")
        peak = int(record.get("peak_kib", 0)) * 1024
        refused = self._cgroup.refused() if self._cgroup is not None else self._pids_refused
        # The JVM says it on stdout.
        stdout = self._streams["stdout"].text()
        reservation = failed_reservation(stderr, self.limits, refused) or failed_reservation(
            stdout, self.limits, refused
        )
        if refused and reservation is None and "can't start new thread" in stderr[-4096:]:
            self._notes.append(f"processes: the run reached its limit of {self.limits.processes} processes and threads")
        oom_killed = self._memory_cgroup is not None and self._memory_cgroup.oom_kills() > 0
        session = self._session_memory
        session_killed = session is not None and signum == signal.SIGKILL and session.oom_kills() > self._session_ooms
        if self._memory_cgroup is not None:
            # All its processes, tmpfs and memfds together: more than any one process's max RSS.
            peak = max(peak, self._memory_cgroup.peak())
        bound = self.limits.memory_bound()
        if session_killed and session is not None:
            # The run has no cgroup of its own in the session's (its bound is not what was reached): one note.
            oom_killed = True
            self._notes.append(
                f"{SESSION_BOUND_NOTE} of {format_size(session.limit or 0)} (every cell, "
                "snapshot, /tmp and /dev/shm together, a memory cgroup) and the kernel killed this cell"
            )
        elif oom_killed and self.limits.resident is not None:
            self._notes.append(
                f"resident: the run reached its resident memory limit of {format_size(self.limits.resident)} "
                "(memory cgroup) and the kernel killed a process of it"
            )
        elif oom_killed and bound is not None:
            self._notes.append(
                f"memory: the run reached its memory bound of {format_size(bound)} (its processes, /tmp, /dev/shm "
                "and memfds together, a memory cgroup) and the kernel killed a process of it; --resident raises it"
            )
        if record.get("disk_full") and self.limits.disk is not None:
            self._notes.append(
                f"disk: the run filled its task directory's limit of {format_size(self.limits.disk)}; "
                "writes past it failed with ENOSPC (No space left on device)"
            )
        status = classify(
            parent_action=self._parent_action,
            exit_code=record.get("exit_code"),
            signum=signum,
            command_cpu=float(record.get("command_cpu", 0.0)),
            peak_memory=peak,
            limits=self.limits,
            memory_error=self._memory_error or ends_in_memory_error(stderr) or reservation is not None or oom_killed,
        )
        if status is Status.MEMORY_LIMIT and reservation is not None and self.limits.memory:
            self._notes.append(reservation_note(reservation, self.limits))
        return Outcome(
            status=status,
            exit_code=record.get("exit_code"),
            signal=signal.Signals(signum).name if signum else None,
            wall_time=round(wall, 4),
            cpu_time=round(float(record.get("cpu", 0.0)), 4),
            peak_memory=peak,
            stdout=self._streams["stdout"].text(),
            stderr=stderr,
            truncated=self.truncated,
            isolation=tuple(self._isolation),
            notes=tuple(dict.fromkeys(self._notes)),
            killed_processes=int(record.get("killed", 0)) if self._swept is None else self._swept,
            as_root=self.as_root,
            supervisor_lost=self._swept is not None,
            limits=self.limits.as_dict(),
        )

    def _cleanup(self) -> None:
        for name in ("_control_w", "_status_r", "_wake_r", "_wake_w", "_channel_r", "_reply_w"):
            fd = getattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        proc = getattr(self, "proc", None)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            self._close_stdin()
            if proc.returncode is None:
                _stop_launcher(proc)
        for name in ("_cgroup", "_memory_cgroup"):
            cgroup = getattr(self, name, None)
            if cgroup is not None:
                if self._reported:
                    cgroup.remove_later()  # the launcher killed everything in it before it reported
                else:
                    cgroup.remove()  # kills what is left, now
                setattr(self, name, None)
        release, self._release = self._release, None
        if release is not None:
            try:
                release()
            except Exception as exc:  # noqa: BLE001 - the run's result matters more than the fork server's
                self._notes.append(f"forkserver: {exc}")
        if self._own_task:
            self.task.remove()


def _stop_launcher(proc: subprocess.Popen[bytes] | _Forked) -> None:
    """End a launcher whose run was abandoned (an exception or Ctrl-C in :meth:`Run.wait`).

    Its control pipe is closed by now, and on end-of-file the launcher kills
    the whole tree and exits by itself: give it :data:`KILL_GRACE` seconds to do
    that before killing it, or the tree it supervises would be left behind.
    """
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout=KILL_GRACE)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return
    # A session's run: its keeper read the end of the control pipe and kills the run itself.
    proc.returncode = -signal.SIGKILL


@functools.cache
def _signal_scope_available() -> bool:
    """``True`` when the kernel's Landlock has the signal scope (ABI 6, Linux 6.12)."""
    return landlock_abi() >= 6


def _run_processes(session: int, group: int | None, cgroup: set[int]) -> set[int]:
    """Live processes in ``session``, in process group ``group`` or in ``cgroup``, and all their descendants."""
    parents: dict[int, int] = {}
    found = set(cgroup)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        if fields[0] == b"Z":
            continue
        parents[pid] = int(fields[1])
        if int(fields[3]) == session or (group is not None and int(fields[2]) == group):
            found.add(pid)
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        found |= more
        grew = bool(more)
    return found & set(parents)


def start(
    argv: Sequence[str],
    *,
    limits: Limits | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | str | None = None,
    task: TaskDirectory | None = None,
    on_stdout: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
    on_message: Callable[[Any], None] | None = None,
    channel: bool = False,
    user: str | int | None = None,
    isolation: Isolation | str | None = None,
    start_method: str | None = None,
    forkserver: ForkServer | None = None,
    pass_fds: Mapping[int, int] | None = None,
) -> Run:
    """Start ``argv`` in a fresh, limited child process and return its :class:`Run`.

    Args:
        argv: the command; ``argv[0]`` is looked up on the child's ``PATH``.
        limits: the run's :class:`Limits` (default: ``Limits()``).
        cwd: the working directory (default: the task directory's ``work/``).
        env: names added on purpose to the allowlisted environment.
        stdin: bytes fed to the child's stdin; ``None`` gives it ``/dev/null``, so
            ``input()`` fails at once with EOFError instead of hanging.
        task: a :class:`TaskDirectory` to use (kept afterwards); by default a new
            one is made and removed when the run ends.
        on_stdout, on_stderr: called in the waiting thread with each decoded chunk.
        on_message: called with each JSON message the child writes on fd 3.
        channel: give the child a message channel: fd 3 to write JSON lines to
            the parent, fd 4 to read the parent's replies (``CELLBOX_CHANNEL=3,4``).
        user: run the command as this user (name or uid); needs root.
        isolation: the isolation layers the run asks for (:class:`~cellbox.sandbox.isolation.Isolation`,
            or a mode: ``"none"``, ``"auto"``, ``"strict"``); default
            :data:`DEFAULT_ISOLATION`.  Active layers are listed in
            ``Outcome.isolation``; a wanted layer this machine lacks is named in
            ``Outcome.notes`` (``auto``) or stops the run (``strict``).
        start_method: ``"spawn"`` (a new interpreter through the launcher) or
            ``"forkserver"`` (forked from ``forkserver``; a run it cannot take
            is spawned, see :meth:`cellbox.sandbox.session.ForkServer.refusal`).
            Default: ``"forkserver"`` when a server is given, else ``"spawn"``.
        forkserver: the :class:`~cellbox.sandbox.session.ForkServer` to fork from.
        pass_fds: fds of this process given to the command at other numbers
            (``{source: target}``), as the fork server's hand-off socket is.

    Raises:
        SandboxError: the run could not be started (empty command, missing
            working directory, unknown user, a layer missing in strict mode).
        IsolationError: ``isolation`` is a string that is not a mode.
    """
    if isinstance(isolation, str):
        isolation = Isolation.from_options(mode=isolation, source="isolation")
    method = start_method or ("forkserver" if forkserver is not None else "spawn")
    if method not in ("spawn", "forkserver"):
        raise SandboxError(f"unknown start method {method!r}; use spawn or forkserver")
    if method == "forkserver" and forkserver is None:
        raise SandboxError("start method forkserver needs a fork server: pass forkserver=ForkServer(...)")
    return Run(
        argv,
        limits=limits or Limits(),
        cwd=cwd,
        env=env,
        stdin=stdin,
        task=task,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        on_message=on_message,
        channel=channel,
        user=user,
        isolation=isolation,
        forkserver=forkserver if method == "forkserver" else None,
        pass_fds=pass_fds,
    )


def run(argv: Sequence[str], **options: Any) -> Outcome:
    """Run ``argv`` to its end under limits and return its :class:`Outcome`.

    Takes the same keyword arguments as :func:`start`.  After it returns, no
    process the run started is alive.

    Raises:
        SandboxError: the run could not be started.
    """
    return start(argv, **options).wait()
