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
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .cgroups import MemoryCgroup, PidsCgroup, memory_cgroup_root, pids_cgroup_root
from .classify import classify, ends_in_memory_error, failed_reservation
from .environment import TaskDirectory, build_environment
from .isolation import (
    BWRAP_LAYERS,
    Isolation,
    Plan,
    bwrap_prefix,
    count_user_tasks,
    landlock_abi,
    landlock_rules,
    make_plan,
    probe,
    socket_filter,
)
from .limits import Limits, format_size
from .outcome import Outcome, Status

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
# Seconds the launcher gets to kill the tree and report before the parent
# kills the launcher itself and stops reading.
KILL_GRACE = 2.0
# Isolation when a caller does not choose: see docs/isolation.md for why.
DEFAULT_ISOLATION = Isolation(mode="none")
# Seconds an interrupted run gets to stop on SIGINT before it is killed.
INTERRUPT_GRACE = 1.0
READ_SIZE = 65536
# Bytes of one message line on the channel, and of all of them in one run:
# rich output (a PNG plot) travels there, so it is larger than ``output``.
CHANNEL_LINE_MAX = 32 * 1024**2
CHANNEL_TOTAL_MAX = 128 * 1024**2
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


class Run:
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
        else:
            self._setup_processes_limit(spec)
            self._setup_resident_limit(spec)
            prefix = self._isolate(plan, spec, argv, child_env) if plan is not None else []
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
                prefix = self._isolate(plan, spec, argv, child_env) if plan is not None else []
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

    def _isolate(self, plan: Plan, spec: dict[str, Any], argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """The bwrap command in front of the launcher, the Landlock rules, and the run's report of the layers."""
        programs = [sys.executable, str(argv[0])]
        prefix: list[str] = []
        # Isolated runs never regain powers through a set-user-ID program (prctl(2) PR_SET_NO_NEW_PRIVS).
        spec["no_new_privs"] = True
        if set(plan.layers) & set(BWRAP_LAYERS) and probe().bwrap is not None:
            prefix = bwrap_prefix(
                plan,
                probe(),
                self.isolation,
                programs=programs,
                cwd=spec["cwd"],
                task=str(self.task.path),
                cgroup=spec.get("cgroup"),
                tmpfs_bytes=self.limits.file_size,
                path=env["PATH"],
                task_size=self._task_tmpfs_size(plan, spec["cwd"]),
                cgroups=spec.get("cgroups", []),
            )
        if not prefix and "user" in plan.layers and plan.user is None and self.isolation.keep_root:
            # Root kept at uid 0 without bubblewrap's user namespace: its capabilities go in the launcher.
            spec["drop_caps"] = True
        if "syscall-filter" in plan.layers:
            spec["seccomp"] = socket_filter(*plan.sockets).hex()
        if "landlock" in plan.layers:
            spec["landlock"] = landlock_rules(
                self.isolation, plan, programs=programs, cwd=spec["cwd"], task=str(self.task.path), path=env["PATH"]
            )
        self._isolation += plan.layers
        uid = spec.get("uid")
        if uid is not None and uid != os.geteuid():
            if "pid" in plan.layers and "nproc_extra" in spec:
                # RLIMIT_NPROC counts the uid's tasks on the whole machine; the
                # launcher sees only its namespace, so count for it here.
                spec["nproc_base"] = count_user_tasks(uid)
            if not _writable_by(spec["cwd"], uid, spec.get("groups") or []):
                self._notes.append(
                    f"fs: the working directory {spec['cwd']} is not writable by {spec.get('user')} (uid {uid})"
                )
        return prefix

    def _task_tmpfs_size(self, plan: Plan, cwd: str) -> int | None:
        """The size of the tmpfs over the task directory (the ``disk`` limit), or ``None`` for none.

        Only with the ``fs`` layer and bwrap's ``--size``, for a run that owns its
        task directory (a caller's task holds files it put there and reads back),
        and whose working directory is the task's ``work/`` or outside the task.
        """
        task = str(self.task.path)
        inside = cwd == task or cwd.startswith(task + os.sep)
        if (
            self.limits.disk is None
            or not self._own_task
            or "fs" not in plan.layers
            or not probe().tmpfs_size
            or (inside and cwd != str(self.task.work))
        ):
            return None
        self._disk_watched = True
        return self.limits.disk

    def _note_disk_limit(self, spec: dict[str, Any], prefix: list[str]) -> None:
        """Watch the task tmpfs (the supervisor reports whether it filled), or say why the total is not capped."""
        if self.limits.disk is None:
            return
        if prefix and self._disk_watched:
            spec["disk_watch"] = str(self.task.path)
            self._isolation.append("disk-tmpfs")
            task = str(self.task.path)
            if not (spec["cwd"] == task or spec["cwd"].startswith(task + os.sep)):
                self._notes.append(
                    f"disk: the working directory {spec['cwd']} is outside the task directory: its total is not "
                    f"capped there, file_size caps each file at {format_size(self.limits.file_size)}"
                )
            return
        self._disk_watched = False
        if not self._own_task:
            why = "the run writes a task directory its caller gave, which is kept"
        else:
            why = "a size-capped tmpfs needs the fs layer: isolation auto with bubblewrap 0.7 or later"
        self._notes.append(
            f"disk: the total written is not capped ({why}); file_size caps each file at "
            f"{format_size(self.limits.file_size)}"
        )

    def _note_session_wide_limits(self) -> None:
        """A run forked from a session shares the session's task directory and cgroups: say what does not hold."""
        if self.limits.disk is not None:
            self._notes.append(
                "disk: the total written is not capped for a run forked from a session (it shares the "
                f"session's task directory); file_size caps each file at {format_size(self.limits.file_size)}"
            )
        if self.limits.resident is not None:
            self._notes.append("resident: not applied to a run forked from a session (it shares the session's cgroups)")

    def _setup_resident_limit(self, spec: dict[str, Any]) -> None:
        """Make the run's memory cgroup for the ``resident`` limit, or say why there is none."""
        self._memory_cgroup = None
        if self.limits.resident is None:
            return
        root = memory_cgroup_root()
        if root is None:
            self._notes.append(
                "resident: not applied (no writable memory cgroup here: /sys/fs/cgroup/memory or a cgroup v2 "
                "root with the memory controller, usually root's only); memory caps each process's address space"
            )
            return
        try:
            self._memory_cgroup = MemoryCgroup(root, self.limits.resident)
        except OSError as exc:
            self._notes.append(f"resident: not applied (memory cgroup unavailable: {exc.strerror or exc})")
            return
        spec["cgroups"] = [*spec.get("cgroups", []), str(self._memory_cgroup.path)]
        self._isolation.append("memory-cgroup")

    def _setup_processes_limit(self, spec: dict[str, Any]) -> None:
        self._cgroup = None
        root = pids_cgroup_root()
        if root is not None:
            try:
                self._cgroup = PidsCgroup(root, self.limits.processes)
                spec["cgroup"] = str(self._cgroup.path)
                self._isolation.append("pids-cgroup")
                return
            except OSError as exc:
                self._notes.append(f"processes: pids cgroup unavailable ({exc.strerror}); using RLIMIT_NPROC")
        spec["nproc_extra"] = self.limits.processes

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
            return self._outcome(record, exec_error, wait_status)
        finally:
            self._cleanup()

    def _pump(self) -> tuple[dict[str, Any] | None, str | None]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        sel.register(self._status_r, selectors.EVENT_READ, "status")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._channel_r is not None:
            sel.register(self._channel_r, selectors.EVENT_READ, "channel")
        if self.proc.stdin is not None:
            sel.register(self.proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
            os.set_blocking(self.proc.stdin.fileno(), False)
        status_buf, channel_buf = bytearray(), bytearray()
        self._kept = 0
        self._channel_total = 0
        record: dict[str, Any] | None = None
        exec_error: str | None = None
        open_count = len(sel.get_map()) - 1  # every source but the wake pipe
        give_up_at: float | None = None
        while open_count > 0:
            now = time.monotonic()
            with self._lock:
                kill_at = self._kill_at
            if give_up_at is not None and now >= give_up_at and (record is not None or self._swept is not None):
                break  # the tree is dead; what still holds the output left it and is not waited for
            if self._parent_action is None and now >= self.deadline:
                self.kill(Status.TIMED_OUT)
                continue
            if kill_at is not None and now >= kill_at:
                if give_up_at is None:
                    self._control("kill")
                    give_up_at = now + KILL_GRACE
                elif now >= give_up_at:
                    self._force_kill()
                    break
            timeout = min(t for t in (self.deadline, kill_at, give_up_at) if t is not None) - now
            for key, _ in sel.select(max(0.0, min(timeout, 1.0))):
                name = key.data
                if name == "wake":
                    os.read(self._wake_r, 4096)
                    continue
                if name == "stdin":
                    if not self._write_stdin(key.fd):
                        sel.unregister(key.fd)
                        self._close_stdin()
                        open_count -= 1
                    continue
                data = self._read(key.fd)
                if name in ("stdout", "stderr"):
                    self._on_output(name, data)
                elif name == "status":
                    status_buf += data
                    while b"\n" in status_buf:
                        line, _, rest = status_buf.partition(b"\n")
                        status_buf[:] = rest
                        record, exec_error = self._on_status(bytes(line), record, exec_error)
                    if record is not None and data:
                        # The exit record is the launcher's last word: its own exit is not
                        # waited for (a fork server's supervisor unmaps a large address space).
                        sel.unregister(key.fd)
                        open_count -= 1
                        continue
                elif name == "channel":
                    self._on_channel(data, channel_buf)
                if not data:
                    sel.unregister(key.fd)
                    open_count -= 1
                if not data and name == "status" and record is None and self._swept is None:
                    # The supervisor is gone without its report: nobody kills the tree but us.
                    self._sweep()
                    give_up_at = time.monotonic() + KILL_GRACE
            if record is not None and give_up_at is None:
                # The launcher has reported and killed what was left; output
                # still held by something outside its tree is not waited for.
                give_up_at = time.monotonic() + KILL_GRACE
        sel.close()
        for stream in self._streams.values():
            stream.feed(b"", final=True)
        return record, exec_error

    @staticmethod
    def _read(fd: int) -> bytes:
        try:
            return os.read(fd, READ_SIZE)
        except OSError:
            return b""

    def _write_stdin(self, fd: int) -> bool:
        if not self._stdin_pending:
            return False
        try:
            written = os.write(fd, self._stdin_pending[:READ_SIZE])
        except BlockingIOError:
            return True
        except OSError:
            return False
        self._stdin_pending = self._stdin_pending[written:]
        return bool(self._stdin_pending)

    def _close_stdin(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _on_output(self, name: str, data: bytes) -> None:
        if not data:
            return
        room = self.limits.output - self._kept
        if len(data) > room:
            # One byte past the limit stops the run; what is past it is
            # drained and dropped while the tree is killed.
            data = data[: max(room, 0)]
            if not self.truncated:
                self.truncated = True
                self.kill(Status.OUTPUT_LIMIT)
        if data:
            self._kept += len(data)
            self._streams[name].feed(data)

    def _on_status(self, line: bytes, record: dict[str, Any] | None, exec_error: str | None):  # type: ignore[no-untyped-def]
        try:
            message = json.loads(line)
        except ValueError:
            return record, exec_error
        event = message.get("event")
        if event == "note":
            self._notes.append(str(message.get("text")))
            if str(message.get("text")).startswith("subreaper"):
                self._isolation.remove("subreaper")
            if str(message.get("text")).startswith("landlock:") and "landlock" in self._isolation:
                self._isolation.remove("landlock")
            if str(message.get("text")).startswith("signal-scope:") and "signal-scope" in self._isolation:
                self._isolation.remove("signal-scope")
        elif event == "command" and isinstance(message.get("pid"), int):
            self._command_pid = message["pid"]
        elif event == "exec_error":
            exec_error = str(message.get("text"))
        elif event == "exit":
            record = message
        return record, exec_error

    def _on_channel(self, data: bytes, buf: bytearray) -> None:
        self._channel_total += len(data)
        if self._channel_total > CHANNEL_TOTAL_MAX:
            self.truncated = True
            self.kill(Status.OUTPUT_LIMIT)
            return
        buf += data
        while b"\n" in buf:
            line, _, rest = buf.partition(b"\n")
            buf[:] = rest
            if self._on_message is None or not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not ours to guess at; the child's runner speaks JSON lines only
            self._on_message(message)
        if len(buf) > CHANNEL_LINE_MAX:
            buf.clear()
            self.truncated = True
            self.kill(Status.OUTPUT_LIMIT)

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
        reservation = self._reservation(stderr)
        oom_killed = self._memory_cgroup is not None and self._memory_cgroup.oom_kills() > 0
        if oom_killed and self.limits.resident is not None:
            self._notes.append(
                f"resident: the run reached its resident memory limit of {format_size(self.limits.resident)} "
                "(memory cgroup) and the kernel killed a process of it"
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
            self._notes.append(
                f"memory: the program could not reserve address space under its {format_size(self.limits.memory)} "
                f"limit ({reservation}); RLIMIT_AS counts what is reserved (thread stacks, a JIT's code range), "
                "not only what is used"
            )
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

    def _reservation(self, stderr: str) -> str | None:
        """A failure to reserve memory under the memory limit that ``stderr`` reports, or ``None``.

        A thread that cannot start is put down to the processes limit instead
        when the run's pids cgroup counted a refused fork (``pids.events``,
        cgroup-v1/pids.rst).
        """
        phrase = failed_reservation(stderr) if self.limits.memory else None
        if phrase != "can't start new thread":
            return phrase
        refused = self._cgroup.refused() if self._cgroup is not None else self._pids_refused
        if refused is None:
            return f"{phrase}, or the processes limit: RLIMIT_NPROC refuses a thread the same way"
        if refused:
            self._notes.append(f"processes: the run reached its limit of {self.limits.processes} processes and threads")
            return None
        return phrase

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


def _writable_by(path: str, uid: int, groups: Sequence[int]) -> bool:
    """Whether ``uid`` (with ``groups``) may create files in the directory ``path``, by its mode bits."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if info.st_uid == uid:
        return bool(info.st_mode & 0o300 == 0o300)
    if info.st_gid in groups:
        return bool(info.st_mode & 0o030 == 0o030)
    return bool(info.st_mode & 0o003 == 0o003)


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
