"""The ``cellbox`` Jupyter kernel: every cell in a fresh, limited child process.

A wrapper kernel on :class:`ipykernel.kernelbase.Kernel` (the pattern of
bash_kernel).  When it starts, it starts the session (:mod:`cellbox.sandbox.session`):
one sandbox with a keeper and the snapshots cells are forked from.  For each
``execute_request`` the kernel process:

1. reads an optional first line ``%%limits wall=5 ...`` (a bad line is an error
   reply and the cell does not run), or a cell that is only ``%undo [N]``;
2. writes the cell's spec to the session's task directory and starts ONE child,
   ``python -m cellbox.kernel.cellrunner SPEC``, through :func:`cellbox.sandbox.start`
   with a message channel, forked from the session's latest snapshot;
3. forwards the child's output and its JSON messages (rich output, errors,
   input requests) as they come, in the order the child sent them;
4. settles the snapshot the child left (kept when the cell finished in its own
   process, dropped when it was stopped) and turns the
   :class:`~cellbox.sandbox.outcome.Outcome` into the reply: a limit becomes an error
   with a name and a sentence (``CellTimeoutError: ...``), and the reply's
   metadata carries the Outcome under ``"cellbox"``.

A frontend's comm messages between cells (widgets) take the same path, one
run each, with the message in the spec as data (:mod:`cellbox.kernel.comms`).

The kernel process never unpickles or evals anything a cell produced (design
rule 6), and no state crosses to it: the state lives in the session's
snapshots.  Blocking waits run in worker threads, so interrupts, stdin and
control messages are served while a cell runs.

Start it with ``python -m cellbox.kernel -f CONNECTION_FILE`` (the kernelspec does).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import dataclasses
import fnmatch
import json
import os
import platform
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipykernel.iostream import OutStream
from ipykernel.kernelbase import Kernel
from traitlets import Bool, Enum, Float, Int, TraitError, Unicode, default, validate

from .. import __version__
from ..sandbox.course import CourseRootError, check_course_root, find_course_root
from ..sandbox.environment import TaskDirectory
from ..sandbox.importpath import trusted_sys_path
from ..sandbox.isolation import Isolation, IsolationError, describe, make_plan, probe
from ..sandbox.limits import LimitError, Limits, format_size
from ..sandbox.outcome import Outcome, Status
from ..sandbox.runs import Run, SandboxError, start
from ..sandbox.session import ForkServer, ForkServerError, installed
from .beside import BESIDE_RUNNER, Beside, complete_reply, empty_complete_reply, inspect_reply, run_beside
from .cellerrors import error_for_outcome, exit_reason
from .cellrunner import history_digest
from .comms import Comms
from .debugger import Debugger, debugpy_available
from .magics import ceiling_from_text, ceiling_note, cell_limits

__all__ = ["CellboxKernel", "main"]

_DEFAULTS = Limits()
# Seconds stream text waits for more, so one print is one message, not two
# (the child writes unbuffered: text and newline arrive separately).
STREAM_DELAY = 0.05
# Task directories of kernel sessions are named so (under the system's temp directory).
TASK_PREFIX = "cellbox-kernel-"
# What a kernel running as root says when its cells keep root's powers.
ROOT_POWERS = (
    "The kernel runs as root, and so do its cells, with root's powers: they can read and change any file and "
    "stop any process of the machine (isolation auto takes those powers away; see `cellbox doctor`)."
)
# The module each cell's process runs, and what the session imports before any cell:
# numpy is cheap and most lessons use it; matplotlib (a third of a second) is imported
# by the cell that uses it, once: the snapshot keeps it for the next cells.
CELL_RUNNER = "cellbox.kernel.cellrunner"
CELL_PRELOAD = (CELL_RUNNER, BESIDE_RUNNER, "cellbox.kernel.cellshell", "cellbox.kernel.magics", "IPython", "numpy")
# In the task directory: the kernel's pid (to find directories of killed kernels).
PID_FILE = "cellbox-kernel.pid"
# Seconds the kernel's exit waits for the control thread to finish the shutdown_request (see main).
CONTROL_STOP_TIMEOUT = 2.0
# Seconds the first cell waits for the session to be ready before it is spawned instead.
SESSION_READY_TIMEOUT = 120.0
# The traceback's last line for a cell whose state is not kept (design: one line says so).
DISCARDED = (
    "cellbox: the cell was stopped, so what it changed is not kept: the next cell sees the names as they were before it"
)
# Statuses whose cell finished in its own process: its snapshot is the next cell's state.
# The share of the session's memory bound (session_memory) it may hold before the oldest states kept for %undo are
# let go at the next run's start: the other half is the next cell's room, as a cell under ipykernel has the memory
# that no earlier state holds.
UNDO_MEMORY_SHARE = 0.5
KEPT_STATUSES = (Status.OK, Status.ERROR, Status.MEMORY_LIMIT, Status.INTERRUPTED)
# Errors of the child held back until the cell ends, where a limit's error may replace them
# (MemoryError by CellMemoryLimitError, a KeyboardInterrupt by the kill after the grace); every other
# error goes out when the child sends it, in its place among the outputs, as under ipykernel.
HELD_ERRORS = ("MemoryError", "KeyboardInterrupt")
# Seconds an interrupted cell's own KeyboardInterrupt handlers get before its processes are killed (the default
# of CellboxKernel.interrupt_grace): ipykernel waits for them for ever, and a checkpoint takes seconds to write.
INTERRUPT_GRACE = 5.0
# Features of ipykernel's kernel_info that cellbox does not have (the messaging spec's supported_features);
# "debugger" is cellbox's own to say (see kernel_info).
UNSUPPORTED_FEATURES = ("debugger", "kernel subshells")
SUBSHELLS_REFUSED = "cellbox runs one cell at a time, each forked from the session's latest state; it has no subshells"
# The mimetype of cellbox's own notes, shown beside a cell as display_data (see CellboxKernel._note).
NOTE_MIMETYPE = "application/vnd.cellbox.note+json"
# History replies name one session: this kernel process's.
SESSION_NUMBER = 1


class KernelStream(OutStream):  # type: ignore[misc]
    """The kernel process's own stdout or stderr, as ipykernel's; its flush waits only after something was written.

    ipykernel's ``execute_request`` flushes both streams before every reply,
    each a round trip to the IOPub thread (0.5 to 1 ms on a 2-core machine).
    Here the kernel process writes to them only by accident (its log goes to
    the terminal); the cells' output is published by the kernel, and waited
    for once before the reply (:meth:`CellboxKernel._iopub_barrier`).  What is
    written still goes out: ``write`` schedules its own flush, as ipykernel's.
    """

    _written = False

    def write(self, string: str) -> int:
        self._written = True
        return super().write(string) or 0

    def flush(self) -> None:
        if self._written:
            self._written = False
            super().flush()


class CellboxKernel(Kernel):
    """A Python kernel that runs every cell in a fresh child process under limits.

    Settings (traitlets, ``--CellboxKernel.NAME=VALUE`` or a config file) are
    the session's limits and switches; a ``%%limits`` line overrides limits for
    one cell.
    """

    implementation = "cellbox"
    implementation_version = __version__
    language = "python"
    language_version = platform.python_version()
    language_info = {
        "name": "python",
        "version": platform.python_version(),
        "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "pygments_lexer": "ipython3",
        "nbconvert_exporter": "python",
        "file_extension": ".py",
    }
    help_links = [
        {"text": "Python Reference", "url": "https://docs.python.org/3/"},
        {"text": "IPython Reference", "url": "https://ipython.readthedocs.io/en/stable/"},
    ]

    wall_time = Float(
        _DEFAULTS.wall_time, help="Seconds of real time a cell may run before it and its processes are stopped."
    ).tag(config=True)
    cpu_time = Float(_DEFAULTS.cpu_time, help="CPU seconds each process of a cell may use (RLIMIT_CPU).").tag(
        config=True
    )
    memory = Unicode(
        format_size(_DEFAULTS.memory or 0),
        help="Address space per process of a cell (RLIMIT_AS), such as 256M or 2G; 'none' for no limit.",
    ).tag(config=True)
    output = Unicode(
        format_size(_DEFAULTS.output), help="Bytes of stdout+stderr a cell may print before it is stopped (e.g. 1M)."
    ).tag(config=True)
    file_size = Unicode(
        format_size(_DEFAULTS.file_size), help="Largest file a cell may write (RLIMIT_FSIZE), e.g. 64M."
    ).tag(config=True)
    open_files = Int(_DEFAULTS.open_files, help="Open file descriptors per process (RLIMIT_NOFILE).").tag(config=True)
    # Not "processes": ipykernel's Kernel already has an attribute of that name.
    max_processes = Int(_DEFAULTS.processes, help="Processes and threads a cell may have at once.").tag(config=True)
    nice = Int(_DEFAULTS.nice, help="CPU niceness of cells, 0 (normal) to 19 (lowest priority).").tag(config=True)
    io_class = Unicode(_DEFAULTS.io_class, help="I/O scheduling class of cells: idle, best-effort or none.").tag(
        config=True
    )
    ceiling = Unicode(
        "",
        help="The most a %%limits line may ask for, as NAME=VALUE words (the %%limits names), such as "
        "'wall=600 memory=2G processes=100'; limits not named keep the default ceiling (docs/reference/settings.md). "
        "A cell that asks for more runs at the ceiling, and is told so in one line. The session's own limits above "
        "raise it where they are higher. Set by an administrator (kernelspec argv, Jupyter config), never by a cell.",
    ).tag(config=True)
    session_memory = Unicode(
        "4G",
        help="Memory the whole session may hold: every cell, the snapshots kept for %undo, and what cells keep in "
        "/tmp and /dev/shm (a memory cgroup, where this machine gives one); 'none' for no bound.",
    ).tag(config=True)
    carry_state = Bool(
        True,
        help="Carry the state from cell to cell: each cell is forked from the process image of the last cell that "
        "finished (a snapshot), so names, modules and open files stay as under ipykernel. False gives every cell "
        "a fresh namespace.",
    ).tag(config=True)

    @default("_execute_sleep")
    def _no_execute_sleep(self) -> float:
        """ipykernel sleeps 0.5 ms after flushing its own streams before each reply (a workaround for its own
        process's output); a cell's output is the kernel's to publish here, and _iopub_barrier puts it out first."""
        return 0.0

    undo_depth = Int(
        3,
        help="Earlier cells whose states are kept for %undo beyond the current one (each snapshot holds the memory "
        "its cell changed; widget events after a cell keep one more, the last one's). Fewer while the session holds "
        "more than half its session_memory: the oldest are let go first.",
    ).tag(config=True)
    interrupt_grace = Float(
        INTERRUPT_GRACE,
        help="Seconds an interrupted cell's KeyboardInterrupt handlers get to finish (saving a checkpoint, say) "
        "before its processes are killed; a second interrupt kills them at once.",
    ).tag(config=True)
    input_wait_cap = Float(
        3600.0,
        help="Seconds of waiting for the user's answer (input(), getpass, pdb's prompt) that do not count against "
        "the cells' wall-clock limits, for the whole session; past them, waiting counts as running. CPU time "
        "always counts.",
    ).tag(config=True)
    isolation = Unicode(
        "auto",
        help="Isolation layers for cells beyond rlimits (namespaces, Landlock; see docs/isolation.md): "
        "none, auto (every layer this machine supports, the others noted) or strict (every layer, or no run).",
    ).tag(config=True)
    network = Bool(False, help="With isolation on: let cells use the network (for example %pip install).").tag(
        config=True
    )
    start_method = Enum(
        ["spawn", "forkserver"],
        "forkserver",
        help="How each cell's fresh process starts: forkserver (forked from the session's latest snapshot, which "
        "carries the state; a cell it cannot take is spawned, with a note) or spawn (a new interpreter for every "
        "cell, and no names carried). See the documentation's page The session.",
    ).tag(config=True)
    notebook_dir = Unicode(
        help="Working directory of every cell; by default the directory the kernel was started in, "
        "which Jupyter sets to the notebook's directory."
    ).tag(config=True)

    course_root = Unicode(
        "",
        help="Top of the folder tree cells may read (read-only; the notebook folder stays the writable one). Empty: "
        "found from the notebook folder (the nearest folder up holding .git, .hg or a project file such as "
        "pyproject.toml or requirements.txt, never a home or /; nothing found: the notebook folder alone). "
        "'none': the notebook folder alone. See the documentation's page The kernel.",
    ).tag(config=True)

    @default("notebook_dir")
    def _default_notebook_dir(self) -> str:
        return os.getcwd()

    @validate("course_root")
    def _check_course_root(self, proposal: Any) -> Any:
        value = str(proposal["value"]).strip()
        if value in ("", "none"):
            return value
        try:
            return check_course_root(value, source="CellboxKernel.course_root")
        except CourseRootError as exc:
            raise TraitError(str(exc)) from None

    def course_tree(self) -> str | None:
        """The course root cells read beside the notebook folder, or ``None`` when that folder alone is shown.

        See :mod:`cellbox.sandbox.course` for how it is found and which folders are refused.
        """
        if self.course_root == "none":
            return None
        root = self.course_root or find_course_root(self.notebook_dir)
        return None if root == os.path.realpath(self.notebook_dir) else root

    @validate(
        "wall_time", "cpu_time", "memory", "output", "file_size", "open_files", "max_processes", "nice", "io_class"
    )
    def _check_limit(self, proposal: Any) -> Any:
        name = proposal["trait"].name
        field = "processes" if name == "max_processes" else name
        try:
            Limits().updated({field: proposal["value"]}, source=f"CellboxKernel.{name}")
        except LimitError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    @validate("ceiling")
    def _check_ceiling(self, proposal: Any) -> Any:
        try:
            ceiling_from_text(proposal["value"])
        except LimitError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    @validate("session_memory")
    def _check_session_memory(self, proposal: Any) -> Any:
        try:
            Limits().updated({"resident": proposal["value"]}, source="CellboxKernel.session_memory")
        except LimitError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    @validate("isolation")
    def _check_isolation(self, proposal: Any) -> Any:
        try:
            Isolation.from_options(mode=proposal["value"], source="CellboxKernel.isolation")
        except IsolationError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    # The cells' isolation, once found (cell_isolation).
    _isolation_found: Isolation | None = None

    def cell_isolation(self) -> Isolation:
        """The isolation of every cell, from the ``isolation`` and ``network`` settings.

        A kernel running as root keeps its cells at uid 0 inside a user
        namespace without capabilities (:attr:`Isolation.keep_root`), so they
        write a root-owned notebook directory and nothing else of root's.
        Found once, as the kernel starts its session (whose sandbox holds that
        view for every cell it forks): the course root's search reads the
        password database and a dozen folders, half a millisecond that every
        cell paid, and a ``.git`` a cell makes later does not widen what cells see.
        """
        if self._isolation_found is None:
            self._isolation_found = self._find_cell_isolation()
        return self._isolation_found

    def _find_cell_isolation(self) -> Isolation:
        isolation = Isolation.from_options(mode=self.isolation, network=self.network, source="CellboxKernel.isolation")
        course = self.course_tree()
        # The kernel's own connection file is covered wherever it lies, in a course folder too.
        connection = getattr(self.parent, "abs_connection_file", None)
        return dataclasses.replace(
            isolation,
            keep_root=True,
            read_only=(*isolation.read_only, *([course] if course else [])),
            hidden=(*isolation.hidden, *([os.path.realpath(connection)] if connection else [])),
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.notebook_dir = self.notebook_dir  # fixed now: the directory the kernel started in
        trusted_sys_path((self.notebook_dir,))  # the cells' folder, when it is not the one it started in
        _remove_stale_task_directories()
        self._count_iopub()
        self.task = TaskDirectory.create(prefix=TASK_PREFIX)
        # The session starts now, beside the kernel's own start: the first cell waits for it.
        self._forkserver: ForkServer | None = None
        if self.start_method == "forkserver":
            self._forkserver = ForkServer(
                installed(CELL_PRELOAD),
                warm=CELL_RUNNER,
                task=self.task,
                isolation=self.cell_isolation(),
                cwd=self.notebook_dir,
                carry=self.carry_state,
                undo_depth=self.undo_depth,
                beside=(BESIDE_RUNNER,),
                ceiling=self.ceiling_limits,
                memory=Limits().updated({"resident": self.session_memory}).resident,
            ).start()
        (self.task.path / PID_FILE).write_text(str(os.getpid()))
        self._inputs: list[str] = [""]  # In[0] is empty, as in IPython
        # IPython's transformed form of each input, as the child that ran it reported
        # (None until then): later children then need not transform all of history again.
        self._transformed: list[str | None] = [""]
        # _digests[n]: history_digest of _inputs[: n + 1], which a cell's spec names its history by.
        self._digests: list[str] = [history_digest([""])]
        self._warned: set[str] = set()
        self._outputs: dict[int, str] = {}  # execution count -> text/plain of its result, for history
        self._running: Run | None = None
        self._interrupted: Run | None = None  # the running cell, once it was interrupted (a second interrupt kills)
        self._input_waited = 0.0  # seconds cells of this session waited for answers, off their wall clocks
        self._input_gate = InputGate()
        self._last_outcome: dict[str, Any] | None = None
        self._notes: list[str] = []  # the notes shown beside the running cell (see _note)
        self._session_lost: str | None = None
        self.debugger = Debugger(
            self.task.tmp / "cells", debugpy_available(), publish=self._debug_event, inspect=self._inspect_variables
        )
        # One run of the session at a time: a cell's, %undo's or a frontend comm message's (see .comms).
        self._turn = asyncio.Lock()
        self._dispatched: str | None = None
        self._comms = Comms(self)
        for msg_type in ("comm_open", "comm_msg", "comm_close"):
            self.shell_handlers[msg_type] = self._comms.request
        atexit.register(self.task.remove)
        # No cell, and no other program of this user, may trace this process or read its memory or
        # environment (the connection key is there): prctl(2) PR_SET_DUMPABLE.
        _not_dumpable()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Terminated (jupyter_client does this when a shutdown takes too long): clean up, then die of it."""
        run = self._running
        if run is not None:
            run.kill()
        if self._forkserver is not None:
            self._forkserver.close()
        self.task.remove()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # ------------------------------------------------------------------ info

    # The settings each of the limits below was last made from, and what they gave: parsed again only when a
    # setting changed (each cell asks for both; parsing them took about 0.15 ms of its path).
    _session_made: tuple[Any, Limits] | None = None
    _ceiling_made: tuple[Any, Limits] | None = None

    @property
    def session_limits(self) -> Limits:
        """The session's limits from the settings (validated when they were set)."""
        settings = {
            "wall_time": self.wall_time,
            "cpu_time": self.cpu_time,
            "memory": self.memory,
            "output": self.output,
            "file_size": self.file_size,
            "open_files": self.open_files,
            "processes": self.max_processes,
            "nice": self.nice,
            "io_class": self.io_class,
        }
        key = tuple(settings.values())
        made = getattr(self, "_session_made", None)  # (the docs' test reads it of the settings alone)
        if made is None or made[0] != key:
            made = self._session_made = (key, Limits().updated(settings, source="CellboxKernel settings"))
        return made[1]

    @property
    def ceiling_limits(self) -> Limits:
        """The most any cell may be given: the ``ceiling`` setting over :data:`DEFAULT_CEILING`, raised to the
        session's limits where those are higher (both are the administrator's)."""
        session = self.session_limits
        key = (self.ceiling, session)
        made = getattr(self, "_ceiling_made", None)
        if made is None or made[0] != key:
            made = self._ceiling_made = (key, ceiling_from_text(self.ceiling).widened(session))
        return made[1]

    @property
    def banner(self) -> str:  # type: ignore[override]
        return (
            f"Python {platform.python_version()} (cellbox {__version__})\n"
            f"Every cell runs in a fresh process with limits: {self.session_limits.describe()}.\n"
            "Change them for one cell with a first line such as: %%limits wall=60 memory=4G\n"
            f"{self._isolation_line()}"
            f"{self._root_line()}"
        )

    def _root_line(self) -> str:
        """The banner's line when the kernel runs as root: what its cells may do with that (empty otherwise)."""
        if os.geteuid() != 0:
            return ""
        try:
            plan = make_plan(self.cell_isolation(), probe(), user=None)
        except Exception:  # noqa: BLE001 - the isolation line has said what is wrong with the setting
            return ""
        if "user" in plan.layers:
            # Without user namespaces (a container's) the capabilities go in the host's namespaces instead.
            own = "of their own user namespace" if probe().userns is None else "(no user namespace here)"
            return (
                f"\nThe kernel runs as root; its cells run as root {own} with every capability "
                "dropped: they write the notebook folder, and cannot raise their limits, mount, or reach other "
                "processes."
            )
        return f"\n{ROOT_POWERS}"

    def _isolation_line(self) -> str:
        """The banner's line on isolation: the layers cells get, or that they can reach the user's files."""
        try:
            line = describe(self.cell_isolation())
        except Exception as exc:  # noqa: BLE001 - a bad setting is reported when a cell runs; the banner still shows
            return f"Isolation: {exc}"
        if self.isolation == "none":
            line += " (cells can read your files and use the network; see `cellbox doctor`)"
        return line[0].upper() + line[1:]

    @property
    def kernel_info(self) -> dict[str, Any]:  # type: ignore[override]
        info = dict(super().kernel_info)
        # No subshells: a subshell's cell would run beside the main one without the session's state (see
        # create_subshell_request). The debugger where debugpy is there for the cells (see cellbox.kernel.debugger).
        features = [f for f in info.get("supported_features", []) if f not in UNSUPPORTED_FEATURES]
        if self.debugger.available:
            features.append("debugger")
        info["supported_features"] = features
        info["debugger"] = self.debugger.available
        return info

    async def do_debug_request(self, msg: Any) -> dict[str, Any]:  # type: ignore[override]
        """One DAP request of the frontend's debugger (control channel): the reply, always (:mod:`.debugger`)."""
        return await self.debugger.handle(msg)

    def _debug_event(self, event: dict[str, Any]) -> None:
        """Publish one DAP event as ``debug_event`` on IOPub, as ipykernel does."""
        if self.session is not None:
            self.session.send(self.iopub_socket, "debug_event", event, self.get_parent("shell"))

    def _inspect_variables(self) -> list[dict[str, Any]] | None:
        """The latest snapshot's variables as DAP Variables, from a discarded run beside it (worker thread)."""
        from .beside import variables_reply

        place = self._beside()
        if place is None:
            return None
        return variables_reply(run_beside(place, {"op": "variables"}))

    async def create_subshell_request(self, socket: Any, ident: Any, parent: Any) -> None:  # type: ignore[override]
        """Refuse a subshell (JEP 91): kernel_info does not offer them, and each cell needs the session's snapshot.

        The reply is an error in the messaging spec's form, so a client that asks anyway is told at once.
        """
        if self.session:
            content = {"status": "error", "ename": "NotImplementedError", "evalue": SUBSHELLS_REFUSED, "traceback": []}
            self.session.send(socket, "create_subshell_reply", content, parent, ident)

    # ------------------------------------------------------------------ execute

    async def do_execute(  # type: ignore[override]
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        **_ignored: Any,
    ) -> dict[str, Any]:
        """Run one cell in a fresh child; see the module docstring for the steps.

        Whatever the reply (a cell's, an ``%undo``'s, a ``%%limits`` line refused), what the request published
        goes out on IOPub before it (:meth:`_iopub_barrier`).
        """
        since = self._iopub_scheduled
        reply = await self._execute(code, silent, store_history, user_expressions, allow_stdin)
        self._iopub_barrier(since=since)
        return reply

    async def _execute(
        self,
        code: str,
        silent: bool,
        store_history: bool,
        user_expressions: dict[str, str] | None,
        allow_stdin: bool,
    ) -> dict[str, Any]:
        """:meth:`do_execute`'s work, before the barrier."""
        self._last_outcome = None
        self._notes = []
        try:
            limits, body = cell_limits(code, self.session_limits)
            ceiling = self.ceiling_limits
        except (LimitError, ValueError, OverflowError) as exc:
            if store_history:
                self._add_input(code, None)
            return self._publish_error("LimitError", str(exc), [f"LimitError: {exc}"])
        limits, over = limits.capped(ceiling)
        if over:
            self._note(ceiling_note(limits, over))
        undo = _undo_request(body)
        if undo is not None:
            return await self._undo(undo, body, store_history)
        if store_history:
            self._add_input(body, None)
        await self._session_ready()
        for note in self._comms.notes:
            self._note(note)
        self._comms.notes.clear()
        async with self._turn:
            return await self._run_cell(
                body, limits, silent, store_history, user_expressions or {}, allow_stdin, source=code
            )

    # How many sends this kernel has queued on IOPub's thread (_count_iopub), and whether that is counted at all.
    _iopub_scheduled = 0
    _iopub_counted = False

    def _count_iopub(self) -> None:
        """Count what is queued on IOPub's thread (its ``schedule``), so a reply whose request queued nothing there
        need not wait for the thread (:meth:`_iopub_barrier`): a trivial cell's round trip to it took 0.5 ms."""
        thread = getattr(self, "iopub_thread", None)
        if thread is None or not callable(getattr(thread, "schedule", None)):
            return
        schedule, lock = thread.schedule, threading.Lock()

        def counted(f: Callable[[], Any]) -> None:
            with lock:  # queued from the shell's thread and from the runs' pumps alike
                self._iopub_scheduled += 1
            schedule(f)

        thread.schedule = counted
        self._iopub_counted = True

    def _iopub_barrier(self, timeout: float = 10.0, since: int | None = None) -> None:
        """Wait (at most ``timeout`` seconds) until IOPub's thread has sent what was queued before: the cell's output
        and errors go out before its reply, as ipykernel's flush before a reply puts out a cell's prints.

        With ``since`` (the count of :meth:`_count_iopub` when the request began), a request that queued nothing
        on the thread does not wait: what was queued before it (its ``busy`` status and ``execute_input``, which
        ipykernel sends before the request's handler) goes out as it does under ipykernel, unawaited.
        """
        if since is not None and self._iopub_counted and self._iopub_scheduled == since:
            return
        thread = self.iopub_thread
        if thread is None or getattr(thread, "thread", None) is None or not thread.thread.is_alive():
            return
        if thread.thread.ident == threading.get_ident():
            return
        sent = threading.Event()
        thread.schedule(sent.set)
        sent.wait(timeout)

    async def _run_cell(
        self,
        body: str,
        limits: Limits,
        silent: bool,
        store_history: bool,
        user_expressions: dict[str, str],
        allow_stdin: bool,
        comm: dict[str, Any] | None = None,
        kind: str = "cell",
        source: str | None = None,
    ) -> dict[str, Any]:
        """Run ``body`` (or, with ``comm``, hand that frontend comm message to the comm manager) in a fresh child,
        settle its snapshot, and build the reply; the caller holds the session's turn.

        ``source`` is the whole cell as the frontend sent it (with its ``%%limits`` line): a debugged cell runs
        under the name and the line numbers the frontend's breakpoints give it.
        """
        await self._make_room()
        cell = _Cell(self, limits, silent, allow_stdin, len(self._inputs) - 1 if store_history else None)
        spec_file: _SpecFile | None = None
        try:
            debug = self.debugger.cell_config()
            if debug is not None and source is not None and source != body:
                debug = {**debug, "source": source}
            spec_file = self._write_spec(
                body, limits, silent, store_history, user_expressions or {}, allow_stdin, comm, debug=debug
            )
            run = start(
                [sys.executable, "-m", CELL_RUNNER, str(spec_file.path)],
                limits=limits,
                task=self.task,
                cwd=self.notebook_dir,
                channel=True,
                on_stdout=cell.thread_safe(cell.stream, "stdout"),
                on_stderr=cell.thread_safe(cell.stream, "stderr"),
                on_message=cell.from_child,
                isolation=self.cell_isolation(),
                forkserver=self._forkserver,
            )
        except (SandboxError, OSError) as exc:
            if spec_file is not None:
                spec_file.remove()
            return self._publish_error("SandboxError", str(exc), [f"SandboxError: {exc}"])
        cell.run = run
        self._running = run
        self._input_gate = cell.input_gate
        if debug is not None:
            self.debugger.send_to_cell = lambda request: run.send({"dap": request})
        try:
            outcome = await asyncio.to_thread(run.wait)
        finally:
            self._running = self._interrupted = None
            cell.close()
            spec_file.remove()
            if debug is not None:
                cell.debug_ended()
        await asyncio.sleep(0)  # let the last forwarded messages go out first
        cell.flush()
        self._settle(cell, outcome, kind)
        self._comms.settled(kind, cell.kept, cell.parent)
        return self._finish(cell, outcome, body)

    async def _make_room(self) -> None:
        """Let the oldest states kept for ``%undo`` go while the session holds more than ``UNDO_MEMORY_SHARE`` of its
        memory bound; the caller holds the session's turn.

        A kept state holds the memory its later cells changed (a redefined array's old copy), which under
        ipykernel would be free, so a notebook that redefines a large array would otherwise fill the session's
        cgroup with old copies and be stopped where ipykernel is not.  The current state is never let go, and
        ``%undo`` then says why it reaches back fewer cells.  Only where the session has a bounded memory cgroup.
        """
        server = self._forkserver
        record = self._comms.record
        if server is None or not self.carry_state or len(record.states) < 2:
            return
        cgroup = server.memory_cgroup
        if cgroup is None or cgroup.limit is None:
            return
        room = int(cgroup.limit * UNDO_MEMORY_SHARE)
        if cgroup.held_over(room) is None:
            return
        count = 0  # first only wait for the snapshots the last settle let go, which may still be exiting
        while len(record.states) > 1:
            try:
                result = await asyncio.to_thread(server.let_go, count)
            except ForkServerError:
                return
            record.let_go(int(result.get("let_go", 0)))
            if (count and not result.get("let_go")) or cgroup.held_over(room) is None:
                return
            count = 1

    async def _session_ready(self) -> None:
        """Wait for the session's first readiness (the kernel started it beside its own start); say when it was lost."""
        if self.isolation == "none" and "isolation-none" not in self._warned:
            self._warned.add("isolation-none")
            # JupyterLab does not show the banner: say it where the user looks.
            self._note(
                "cellbox: note: this kernel's cells run with isolation none: they can read your files, use the "
                "network and signal your other programs (see `cellbox doctor`)"
                + (f"\ncellbox: note: {ROOT_POWERS}" if os.geteuid() == 0 else ""),
            )
        server = self._forkserver
        if server is None:
            return
        if server.pid is None and server.broken is None:
            await asyncio.to_thread(server.wait_ready, SESSION_READY_TIMEOUT)
        note = self._session_replaced()
        if note:
            self._note(note)

    def _session_replaced(self) -> str | None:
        """The note for a session that was replaced since the last run (it ended, or a package was installed), once:
        its comms are closed then, as its widgets have no live value; ``None`` when it was not."""
        server = self._forkserver
        if server is None or not server.lost or server.lost == self._session_lost:
            return None
        self._session_lost = server.lost
        self._comms.lost(self.get_parent("shell"))
        return (
            f"cellbox: the session's state was lost ({server.lost}); this cell starts without the names "
            "of earlier cells"
        )

    def _settle(self, cell: _Cell, outcome: Outcome, kind: str = "cell") -> None:
        """Keep the finished cell's (or ``kind="comm"``: comm run's) snapshot as the next state, or drop it."""
        server, run = self._forkserver, cell.run
        if server is None or run is None or not self.carry_state:
            return
        if run.start_method != "forkserver":
            self._warn_once(
                {"spawned": ""},
                "cellbox: this cell ran in a new process of its own, without the names of earlier cells, "
                "and what it defines is not kept (see the reply's notes for why)",
            )
            return
        # A cell that finished in its own process (an interrupt it stopped at included) forked its
        # snapshot; one stopped by a kill, a limit or a crash did not, or is not trusted to have.
        keep = bool(run.left_snapshot) and outcome.signal is None and outcome.status in KEPT_STATUSES
        # Not waited for: the keeper settles while the reply goes out, and the exit record said what it gives.
        server.settle(keep, wait=False, kind=kind)
        facts = run.settle_facts.get("keep" if keep else "drop")
        if facts:
            cell.snapshot = {"kept": keep, **facts}
        cell.discarded = not keep and run.left_snapshot is not None
        cell.kept = keep

    async def _undo(self, count: int, code: str, store_history: bool) -> dict[str, Any]:
        """``%undo [N]``: put the state back to what it was before the last N cells that kept theirs."""
        if store_history:
            self._add_input(code, code)
        server = self._forkserver
        if count < 1:
            return self._publish_error("UsageError", "%undo takes a number of cells, such as %undo 2", [])
        if server is None or not self.carry_state:
            message = "%undo needs the session's snapshots (start_method=forkserver and carry_state=True)"
            return self._publish_error("UsageError", message, [f"UsageError: {message}"])
        await self._session_ready()
        async with self._turn:
            # Cells, not widget events: the states widget messages left after a cell go with it (see .comms).
            snapshots, _cells = self._comms.record.to_undo(count)
            try:
                result = await asyncio.to_thread(server.undo, snapshots) if snapshots else {"undone": 0}
            except ForkServerError as exc:
                return self._publish_error("UsageError", f"%undo: {exc}", [f"UsageError: %undo: {exc}"])
            undone = self._comms.undone(int(result.get("undone", 0)), self.get_parent("shell"))
        cells = "1 cell" if undone == 1 else f"{undone} cells"
        if undone == 0:
            text = "Nothing to undo: no earlier state is kept.\n"
        else:
            text = (
                f"Undid {cells}: the names are as they were before {'it' if undone == 1 else 'them'}. "
                "Files written and output shown stay as they are.\n"
            )
        if undone < count and self._comms.record.short_of_memory:
            cgroup = server.memory_cgroup
            bound = format_size(cgroup.limit) if cgroup is not None and cgroup.limit is not None else "its"
            text += (
                f"(Only {cells} could be undone: older states were let go when the session held more than half its "
                f"{bound} memory bound, to leave the next cell room; CellboxKernel.session_memory sets the bound.)\n"
            )
        elif undone < count:
            text += f"(Only {cells} could be undone; CellboxKernel.undo_depth sets how many are kept.)\n"
        text += "".join(line + "\n" for line in shared_memory_line(result.get("shared")))
        self._stream("stdout", text)
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

    def _add_input(self, source: str, transformed: str | None) -> None:
        """One more input in the session's history (``In[n]``), its transformed form, and its digest."""
        self._inputs.append(source)
        self._transformed.append(transformed)
        self._digests.append(history_digest([source], self._digests[-1]))

    def _history_before(self, store_history: bool) -> int:
        """How many entries of history (``In[0]`` included) the cell's shell must have before it runs."""
        return len(self._inputs) - 1 if store_history else len(self._inputs)

    def history_file(self, store_history: bool) -> _SpecFile:
        """The inputs (and transformed forms) a cell's shell must have, written for a ``history_request``.

        Raises:
            OSError: the task's ``tmp/`` cannot be written.
        """
        count = self._history_before(store_history)
        return _SpecFile(self.task.tmp, {"history": self._inputs[:count], "transformed": self._transformed[:count]})

    def _write_spec(
        self,
        code: str,
        limits: Limits,
        silent: bool,
        store_history: bool,
        user_expressions: dict[str, str],
        allow_stdin: bool,
        comm: dict[str, Any] | None = None,
        debug: dict[str, Any] | None = None,
    ) -> _SpecFile:
        before = self._history_before(store_history)
        spec = {
            "code": code,
            "execution_count": self.execution_count,
            "store_history": store_history,
            "silent": silent,
            "allow_stdin": allow_stdin,
            "user_expressions": user_expressions,
            # The shell's In must be the inputs before this cell: named by length and digest (see
            # cellrunner.history_digest); a shell whose In differs asks for them (history_request).
            "history_length": before,
            "history_digest": self._digests[before - 1],
            "limits": limits.as_dict(),
            # The shell `!cmd` runs under, as ipykernel's cells have it: the user's (IPython reads $SHELL).
            "shell": os.environ.get("SHELL", ""),
            # What the cell's get_ipython().kernel.get_parent() and .config["IPKernelApp"] give libraries: the
            # request's header, and the connection file's name without its folder (and never its key).
            "parent": {"header": _header(self.get_parent("shell"))},
            "connection_file": os.path.basename(str(getattr(self.parent, "connection_file", "") or "")),
        }
        if debug is not None:
            spec["debug"] = debug  # breakpoints: the cell runs under the debugger (cellbox.kernel.debugcell)
        if comm is not None:
            spec["comm"] = comm  # a frontend comm message, as data (cellbox.kernel.cellcomm.dispatch)
        # A cell may have removed parts of the task directory: make them again.
        for directory in (self.task.home, self.task.work):
            if not os.path.isdir(directory):
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The spec goes in the task's tmp/, which the sandbox gives to the user cells run as.
        return _SpecFile(self.task.tmp, spec)

    def _finish(self, cell: _Cell, outcome: Outcome, code: str) -> dict[str, Any]:
        """Publish the cell's error (if any) and build the reply.

        ``code`` is the cell without its ``%%limits`` line.
        """
        self._last_outcome = _outcome_metadata(outcome)
        if cell.snapshot:
            self._last_outcome["snapshot"] = cell.snapshot
        if self.isolation != "none":
            self._warn_once({note: "" for note in outcome.notes}, "cellbox: note: {names}")
        else:
            # With isolation none the first cell says what cells can reach; the session's memory bound is said too.
            memory = {note: "" for note in outcome.notes if note.startswith("memory: the session's bound")}
            self._warn_once(memory, "cellbox: note: {names}")
        run = cell.run
        ended_early = run is not None and run.left_snapshot is False and self.carry_state
        if ended_early and run is not None and run.snapshot_error:
            # It finished, but its state could not be kept (its fork refused: the processes it left running
            # took its processes limit): said in one line, and the cell's reply is its own.
            ended_early = False
            self._note(
                f"cellbox: what this cell defined is not kept: {run.snapshot_error}; the next cell sees the names "
                "as they were before it",
            )
        handled = _handled_interrupt(outcome, cell) if not ended_early else None
        if handled is not None:
            # Its own `except KeyboardInterrupt:` ended it in its own process, well or with an error of its own:
            # the cell's reply is its own, as under ipykernel (its state was kept by _settle).
            outcome = dataclasses.replace(outcome, status=handled)
        if outcome.status is Status.OK and ended_early and not cell.failed:
            # The runner never got back from the cell: its process ended (os._exit) part way.
            reason = exit_reason(outcome)
            shared = shared_memory_line(cell.snapshot.get("shared"))
            return self._publish_error("CellExitedError", reason, [f"CellExitedError: {reason}", DISCARDED, *shared])
        if outcome.status is Status.OK:
            for error in cell.errors:  # one the cell showed and carried on after (a MemoryError caught)
                if not error.pop("published", False):
                    self.send_response(self.iopub_socket, "error", error)
            return {
                "status": "ok",
                "execution_count": self.execution_count,
                "payload": cell.payload,
                "user_expressions": cell.user_expressions,
            }
        named = error_for_outcome(outcome, cell.limits, kept=cell.kept)
        last = cell.errors[-1] if cell.errors else None
        if named is None and (cell.errors or cell.failed):
            for error in cell.errors:
                if not error.pop("published", False):
                    self.send_response(self.iopub_socket, "error", error)
            reply = dict(last or {"traceback": []})
            reply.update(cell.failed or {})
            return self._error_reply(reply, cell.payload)
        if named is None:
            named = "CellExitedError", exit_reason(outcome)
        ename, evalue = named
        kept = [DISCARDED, *shared_memory_line(cell.snapshot.get("shared"))] if cell.discarded else []
        if ename == "KeyboardInterrupt" and last and last["ename"] == "KeyboardInterrupt":
            return self._publish_error(last["ename"], last["evalue"], [*last["traceback"], *kept])
        # The limit's line ends the last error's traceback, unless that error is already out.
        traceback = list(last["traceback"]) if last and not last.get("published") else []
        return self._publish_error(ename, evalue, [*traceback, f"{ename}: {evalue}", *kept])

    def _warn_once(self, items: dict[str, str], template: str) -> None:
        """Show ``template`` with the items not noted before (``name (why)``) as a note (see :meth:`_note`)."""
        fresh = {name: why for name, why in items.items() if name not in self._warned}
        if fresh:
            self._warned.update(fresh)
            names = ", ".join(f"{name} ({why})" if why else name for name, why in sorted(fresh.items()))
            self._note(template.format(names=names))

    def _note(self, text: str) -> None:
        """Show one of cellbox's own notes beside the cell, where graders do not score it, and keep it for the reply.

        Never on stderr or stdout: nbgrader scores a test cell zero for any
        stderr output, and a cell that did nothing wrong must score as under
        ipykernel.  A ``display_data`` of ``text/plain`` (what JupyterLab
        shows) and :data:`NOTE_MIMETYPE` (what a program looks for), which
        nbgrader's ``determine_grade`` does not read; the execute reply's
        metadata lists the cell's notes under ``cellbox.kernel_notes``.
        """
        text = text.rstrip("\n")
        self._notes.append(text)
        content = {"data": {"text/plain": text, NOTE_MIMETYPE: {"text": text}}, "metadata": {}, "transient": {}}
        self.send_response(self.iopub_socket, "display_data", content)

    def _publish_error(self, ename: str, evalue: str, traceback: list[str]) -> dict[str, Any]:
        content = {"ename": ename, "evalue": evalue, "traceback": traceback}
        self.send_response(self.iopub_socket, "error", content)
        return self._error_reply(content, [])

    def _error_reply(self, error: dict[str, Any], payload: list[Any]) -> dict[str, Any]:
        return {
            "status": "error",
            "execution_count": self.execution_count,
            "ename": str(error.get("ename", "Error")),
            "evalue": str(error.get("evalue", "")),
            "traceback": list(error.get("traceback", [])),
            "payload": payload,
            "user_expressions": {},
        }

    def _stream(self, name: str, text: str) -> None:
        self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def finish_metadata(self, parent: Any, metadata: dict[str, Any], reply_content: dict[str, Any]) -> dict[str, Any]:
        """Add the cell's Outcome (without its output) under ``"cellbox"``."""
        metadata = dict(super().finish_metadata(parent, metadata, reply_content))
        metadata["status"] = reply_content.get("status")
        if self._last_outcome is not None:
            metadata["cellbox"] = self._last_outcome
        if self._notes:
            metadata.setdefault("cellbox", {})["kernel_notes"] = list(self._notes)
        return metadata

    # ------------------------------------------------------------------ interrupt, stdin

    def pre_handler_hook(self) -> None:
        # Which request ipykernel dispatches on its own (not beside another): comms look (see .comms).
        self._dispatched = (self.get_parent("shell").get("header") or {}).get("msg_id")
        # SIGINT (signal interrupt mode, or the killpg of message mode) interrupts
        # the running cell, never this process.
        self.saved_sigint_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def post_handler_hook(self) -> None:
        signal.signal(signal.SIGINT, self.saved_sigint_handler)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupt_cell()

    def interrupt_cell(self) -> None:
        """Interrupt the running cell (thread-safe): SIGINT to its group, SIGKILL after a grace or a second interrupt.

        The grace (:attr:`interrupt_grace`) is the time the cell's own
        ``except KeyboardInterrupt:`` handlers get to finish; a second
        interrupt of the same cell does not wait for them.
        """
        run = self._running
        if run is not None and self._interrupted is run:
            run.kill()
        elif run is not None:
            self._interrupted = run
            run.interrupt(grace=self.interrupt_grace)
        # Not gate.close(): this may run in a signal handler, which must not wait for the gate's lock.
        self._input_gate.closed.set()

    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:  # type: ignore[override]
        """Message-mode interrupt: interrupt the cell directly (the kernel process keeps running)."""
        self.interrupt_cell()
        if self.session:
            self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    def ask_frontend(self, prompt: str, password: bool, ident: Any, parent: Any, gate: InputGate) -> Any:
        """Send an ``input_request`` on the stdin channel and wait for the reply (worker thread).

        Like ipykernel's ``Kernel._input_request``, but sends nothing once
        ``gate`` is closed, and stops waiting when it closes (the cell was
        interrupted or ended).

        Returns:
            ``{"value": text}``, ``{"eof": True}`` or ``{"interrupted": True}``.
        """
        import zmq

        assert self.session is not None
        while True:  # drop stale replies, as ipykernel does
            try:
                self.stdin_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
        with gate.lock:
            if gate.closed.is_set():
                return {"interrupted": True}
            content = {"prompt": prompt, "password": password}
            request = self.session.send(self.stdin_socket, "input_request", content, parent, ident)
        asked = (request or {}).get("header", {}).get("msg_id")
        while not gate.closed.is_set():
            readable, _, _ = zmq.select([self.stdin_socket], [], [], 0.05)
            if not readable:
                continue
            _ident, reply = self.session.recv(self.stdin_socket)
            if reply is None:
                continue
            answered = reply.get("parent_header", {}).get("msg_id")
            if answered and answered != asked:
                continue  # the late answer to an earlier, interrupted request (JupyterLab names the request)
            value = str(reply["content"].get("value", ""))
            return {"eof": True} if value == "\x04" else {"value": value}
        return {"interrupted": True}

    # ------------------------------------------------------------------ other requests

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]
        """Kill a running cell and remove the session's task directory."""
        run = self._running
        if run is not None:
            run.kill()
        self._input_gate.close()
        self._comms.lost(self.get_parent("shell"))  # the widgets go with the session
        if self._forkserver is not None:
            self._forkserver.close()
        self.task.remove()
        return {"status": "ok", "restart": restart}

    async def comm_info_request(self, stream: Any, ident: Any, parent: Any) -> None:  # type: ignore[override]
        """The comms open in the session's state, from the kernel's own record (nothing runs; see .comms)."""
        content = parent.get("content") if isinstance(parent.get("content"), dict) else {}
        target = content.get("target_name")
        if self.session:
            reply = self._comms.info(target if isinstance(target, str) else None)
            self.session.send(stream, "comm_info_reply", reply, parent, ident)

    def do_is_complete(self, code: str) -> dict[str, Any]:  # type: ignore[override]
        """``complete``, ``incomplete`` (with an indent) or ``invalid``, by IPython's rules (magics included)."""
        from .completion import is_complete

        return is_complete(code)

    def _beside(self) -> Beside | None:
        """Where completion and inspection run: the session, beside its latest state; ``None`` when not now.

        Not while a cell runs (the session runs one process at a time, and the
        cell comes first): the frontend then gets the empty reply at once.
        """
        server = self._forkserver
        if server is None or not self.carry_state or self._running is not None or self._turn.locked():
            return None
        return Beside(server, self.task, self.notebook_dir, self.cell_isolation(), self.session_limits)

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:  # type: ignore[override]
        """IPython's completions on the live namespace, from a run beside the state (:mod:`.beside`)."""
        place = self._beside()
        if place is None:
            return empty_complete_reply(cursor_pos)
        async with self._turn:  # no comm run starts beside it
            request = {"op": "complete", "code": code, "cursor_pos": cursor_pos}
            content = await asyncio.to_thread(run_beside, place, request)
        return complete_reply(content, code, cursor_pos)

    async def do_inspect(  # type: ignore[override]
        self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        """IPython's inspector on the live namespace (signature, docstring), from a run beside the state."""
        place = self._beside()
        if place is None:
            return inspect_reply(None)
        request = {"op": "inspect", "code": code, "cursor_pos": cursor_pos, "detail_level": int(detail_level)}
        request["omit_sections"] = [str(section) for section in omit_sections or ()]
        async with self._turn:  # no comm run starts beside it
            return inspect_reply(await asyncio.to_thread(run_beside, place, request))

    def do_history(  # type: ignore[override]
        self,
        hist_access_type: str,
        output: bool,
        raw: bool,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict[str, Any]:
        """This session's inputs (and with ``output``, the text of their results), as the protocol asks.

        ``tail`` gives the last ``n``; ``range`` the cells ``start`` to ``stop - 1``;
        ``search`` the cells matching the glob ``pattern`` (newest ``n``, ``unique``).
        """
        entries = [(SESSION_NUMBER, number, source) for number, source in enumerate(self._inputs) if number]
        if hist_access_type == "range":
            low, high = start or 1, stop if stop is not None else len(self._inputs)
            entries = [e for e in entries if low <= e[1] < high]
        elif hist_access_type == "search":
            entries = [e for e in entries if fnmatch.fnmatchcase(e[2], pattern or "*")]
            if unique:
                newest = {source: (a, b, source) for a, b, source in entries}
                entries = sorted(newest.values(), key=lambda e: e[1])
        if hist_access_type in ("tail", "search") and n:
            entries = entries[-n:]
        if output:
            entries = [(a, b, (src, self._outputs.get(b))) for a, b, src in entries]  # type: ignore[misc]
        return {"status": "ok", "history": entries}


class InputGate:
    """Whether a cell may still ask the frontend for input: closed at an interrupt and when the cell ends.

    An ``input_request`` is sent under :attr:`lock`, and the end of a cell
    closes the gate under it too, so no request reaches the frontend after the
    cell's reply: its input box would stay open with no cell to answer it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = threading.Event()

    def close(self) -> None:
        """Close the gate; waits for a request being sent to be sent."""
        with self.lock:
            self.closed.set()


class _Cell:
    """One running cell: forwards the child's output and messages to the frontend.

    Callbacks arrive in the sandbox's waiting thread; :meth:`thread_safe` hands
    them to the kernel's event loop, in order, so all sends happen there.
    """

    def __init__(
        self, kernel: CellboxKernel, limits: Limits, silent: bool, allow_stdin: bool, history_index: int | None
    ) -> None:
        self.kernel = kernel
        self.history_index = history_index
        self.limits = limits
        self.silent = silent
        self.allow_stdin = allow_stdin
        self.loop = asyncio.get_running_loop()
        self.parent = kernel.get_parent("shell")
        self.ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
        self.run: Run | None = None
        self.errors: list[dict[str, Any]] = []  # the child's errors; see HELD_ERRORS for when each is published
        self.failed: dict[str, str] | None = None
        self.payload: list[Any] = []
        self.discarded = False  # stopped before it could leave its state: the next cell has the one before
        self.kept = False  # its state is the next cell's (its error's words say so)
        self.snapshot: dict[str, Any] = {}  # the session's word on the state it left, for the reply's metadata
        self.user_expressions: dict[str, Any] = {}
        self.input_gate = InputGate()
        self.history_file: _SpecFile | None = None  # written for the cell's history_request, removed at its end
        self._pending: tuple[str, list[str]] | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self._stopped_at: float | None = None  # when the debugged cell stopped at a breakpoint (monotonic s)
        self._stop_budget = 0.0  # seconds the deadline was moved out by at that stop

    def thread_safe(self, method: Callable[..., None], *first: Any) -> Callable[[Any], None]:
        def forward(value: Any) -> None:
            self.loop.call_soon_threadsafe(method, *first, value)  # type: ignore[arg-type]

        return forward

    def from_child(self, message: Any) -> None:
        """A message from the child, in the sandbox's waiting thread: noted now if it bears on the Outcome.

        ``memory_error`` must reach the run before :meth:`Run.wait` classifies
        it, which it does in this same thread right after the child ends: handed
        to the event loop, it could come too late (the cell then read ``error``).
        Everything else goes to :meth:`message` on the event loop, in order.
        """
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "memory_error" and self.run is not None:
            self.run.note_memory_error()
        if kind == "stream" and self.run is not None:
            # Counted and forwarded as the pipes' output is, in the order it came with the rest.
            self.run.add_output(str(message.get("name")), str(message.get("text", "")))
            return
        if kind == "history_request" and self.run is not None:
            self.run.send(self._history_reply())
            return
        if kind == "dap":
            # A response goes to its waiting request now; an event to the frontend, in order with the rest.
            event = self.kernel.debugger.from_cell(message.get("message"))
            if event is not None:
                self.loop.call_soon_threadsafe(self.debug_event, event)
            return
        self.loop.call_soon_threadsafe(self.message, message)

    def debug_event(self, event: dict[str, Any]) -> None:
        """Publish a DAP event of the debugged cell; time stopped at a breakpoint is off its wall clock.

        As for an input prompt (:meth:`_waiting_for_the_user`): at ``stopped``
        the deadline moves out by what is left of the session's
        ``input_wait_cap``, at ``continued`` back to the time actually stopped,
        which the cap is charged.  CPU time always counts.
        """
        self.flush()
        kind = event.get("event")
        if kind == "stopped" and self._stopped_at is None:
            self._stop_budget = max(0.0, self.kernel.input_wait_cap - self.kernel._input_waited)
            self._stopped_at = time.monotonic()
            if self.run is not None:
                self.run.move_deadline(self._stop_budget)
        elif kind == "continued":
            self._resumed()
        self.kernel._debug_event(event)

    def _resumed(self) -> None:
        if self._stopped_at is None:
            return
        waited = min(time.monotonic() - self._stopped_at, self._stop_budget)
        self._stopped_at = None
        self.kernel._input_waited += waited
        if self.run is not None:
            self.run.move_deadline(waited - self._stop_budget)

    def debug_ended(self) -> None:
        """The cell under the debugger ended: the frontend is told it runs no more if it was stopped."""
        self._resumed()
        event = self.kernel.debugger.cell_ended()
        if event is not None:
            self.kernel._debug_event(event)

    def _history_reply(self) -> dict[str, Any]:
        """Where the shell finds the history it must have; once per cell (its shell asks before the cell runs)."""
        if self.history_file is not None:
            return {"error": "the history was given already"}
        try:
            self.history_file = self.kernel.history_file(self.history_index is not None)
        except OSError as exc:
            return {"error": f"the history could not be written ({exc.strerror or exc})"}
        return {"path": str(self.history_file.path)}

    def close(self) -> None:
        """At the cell's end: no more input, and the history file (if any) removed."""
        self.input_gate.close()
        if self.history_file is not None:
            self.history_file.remove()

    def send(self, msg_type: str, content: dict[str, Any]) -> None:
        session = self.kernel.session
        if session is not None:
            session.send(self.kernel.iopub_socket, msg_type, content, self.parent)

    def stream(self, name: str, text: str) -> None:
        """Queue stream text; pieces that come within :data:`STREAM_DELAY` go out as one message."""
        if self._pending and self._pending[0] != name:
            self.flush()
        if not self._pending:
            self._pending = (name, [])
            self._flush_handle = self.loop.call_later(STREAM_DELAY, self.flush)
        self._pending[1].append(text)

    def flush(self) -> None:
        """Send the queued stream text now (before any other message, and at the end of the cell)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._pending:
            name, parts = self._pending
            self._pending = None
            self.send("stream", {"name": name, "text": "".join(parts)})

    def message(self, message: Any) -> None:
        """Handle one JSON message from the child (never evaluated, only forwarded)."""
        if not isinstance(message, dict):
            return
        self.flush()
        kind = message.get("type")
        if kind in ("display_data", "update_display_data"):
            self.send(kind, _without_note(_pick(message, "data", "metadata", "transient")))
        elif kind == "execute_result" and not self.silent:
            content = _without_note(_pick(message, "data", "metadata"))
            content["execution_count"] = self.kernel.execution_count
            self.kernel._outputs[self.kernel.execution_count] = str(content["data"].get("text/plain", ""))
            self.send("execute_result", content)
        elif kind == "clear_output":
            self.send("clear_output", {"wait": bool(message.get("wait"))})
        elif kind == "error":
            error: dict[str, Any] = {
                "ename": str(message.get("ename", "Error")),
                "evalue": str(message.get("evalue", "")),
                "traceback": [str(line) for line in message.get("traceback") or []],
            }
            if error["ename"] not in HELD_ERRORS:
                # Sent now, in its place among the cell's outputs: a figure the cell's end shows comes after.
                self.send("error", error)
                error["published"] = True
            self.errors.append(error)
        elif kind == "failed":
            self.failed = {"ename": str(message.get("ename", "Error")), "evalue": str(message.get("evalue", ""))}
        elif kind == "input_request":
            asyncio.ensure_future(self._answer(str(message.get("prompt", "")), bool(message.get("password"))))
        elif kind == "payload" and isinstance(message.get("payload"), list):
            self.payload = message["payload"]
        elif kind == "threads_left" and type(count := message.get("count")) is int and count > 0:
            # The runner's word (threads the cell left), which the cell could send as well: a number only,
            # and the note's words are the kernel's.  Never the cell's stderr.
            were = "1 thread was" if count == 1 else f"{count} threads were"
            self.kernel._note(f"cellbox: {were} still running when the cell ended, and stopped with it")
        elif kind == "debugger_failed":
            self.kernel._note("cellbox: the debugger could not start in this cell (stderr says why); it ran without it")
        elif kind == "comm":
            self.kernel._comms.from_cell(self, message)
        elif kind == "user_expressions" and isinstance(message.get("value"), dict):
            self.user_expressions = message["value"]
        elif kind == "transformed" and isinstance(message.get("source"), str) and self.history_index is not None:
            # The first is the runner's, sent before the cell's own code ran.
            if self.kernel._transformed[self.history_index] is None:
                self.kernel._transformed[self.history_index] = message["source"]

    async def _answer(self, prompt: str, password: bool) -> None:
        if self.run is None:
            return
        if not self.allow_stdin:
            self.run.send({"error": "this frontend does not support input requests"})
            return
        reply = await self._waiting_for_the_user(prompt, password)
        if not reply.get("interrupted"):
            # An interrupted request gets no answer: the SIGINT the cell gets ends its input() (a cell that
            # ignores SIGINT is killed after the grace), so one interrupt is one KeyboardInterrupt.
            self.run.send(reply)

    async def _waiting_for_the_user(self, prompt: str, password: bool) -> dict[str, Any]:
        """Ask the frontend; the time the user takes does not count against the cell's wall-clock limit.

        The deadline moves out by what is left of the session's
        ``input_wait_cap`` while the request is open, then back to the time
        actually waited, which the session's cap is charged.
        """
        run, kernel = self.run, self.kernel
        budget = max(0.0, kernel.input_wait_cap - kernel._input_waited)
        if run is not None:
            run.move_deadline(budget)
        asked = time.monotonic()
        try:
            return await asyncio.to_thread(
                kernel.ask_frontend, prompt, password, self.ident, self.parent, self.input_gate
            )
        finally:
            waited = min(time.monotonic() - asked, budget)
            kernel._input_waited += waited
            if run is not None:
                run.move_deadline(waited - budget)


class _SpecFile:
    """A cell's spec (JSON), written where its process reads it, through a descriptor of that folder.

    The folder is the task's ``tmp/``, which cells may change: it is opened
    with ``O_NOFOLLOW`` (a symlink a cell left there is removed and the folder
    made again), and the file is created in it by that descriptor with
    ``O_EXCL | O_NOFOLLOW`` and removed by it (open(2), openat(2)), so the
    kernel never writes or unlinks outside the task directory whatever a cell
    put in place of ``tmp/``, before or during its run.

    Raises:
        OSError: the folder cannot be made or opened.
    """

    def __init__(self, folder: Path, spec: dict[str, Any]) -> None:
        self.folder = folder
        self._dir = _open_folder(folder)
        self.name = f"cellbox-cell-{secrets.token_hex(8)}.json"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.name, flags, 0o644, dir_fd=self._dir)
            try:
                os.fchmod(fd, 0o644)  # readable by the cell's user; tmp/ itself is closed to others
                data = json.dumps(spec).encode("utf-8")
                while data:
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
        except BaseException:
            self.remove()
            raise

    @property
    def path(self) -> Path:
        """Where the cell's process reads it."""
        return self.folder / self.name

    def remove(self) -> None:
        """Unlink the spec from the folder it was written in (idempotent)."""
        if self._dir < 0:
            return
        try:
            os.unlink(self.name, dir_fd=self._dir)
        except OSError:
            pass
        os.close(self._dir)
        self._dir = -1


def _open_folder(folder: Path) -> int:
    """A descriptor of ``folder``, a real folder: a symlink or file in its place is removed and the folder made."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(folder, flags)
    except OSError:
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            folder.unlink()  # the link itself, never its target
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(folder, flags)


def _remove_stale_task_directories() -> None:
    """Remove task directories of kernels that died without cleaning up (SIGKILL).

    Each kernel writes its pid into its task directory; a directory whose
    kernel is no longer running (or whose pid now belongs to another program)
    is removed.
    """
    import glob

    for pid_file in glob.glob(os.path.join(tempfile.gettempdir(), TASK_PREFIX + "*", PID_FILE)):
        try:
            pid = int(Path(pid_file).read_text())
            if os.stat(pid_file).st_uid != os.geteuid():
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                alive = b"cellbox.kernel" in f.read()
        except FileNotFoundError:
            alive = False
        except (OSError, ValueError):
            continue
        if not alive:
            TaskDirectory(*(Path(pid_file).parent / part for part in ("", "home", "work", "tmp"))).remove()


_UNDO = re.compile(r"\s*%undo(?:\s+(\S+))?\s*")


def shared_memory_line(shared: Any) -> list[str]:
    """The one line that names the state's shared memory mappings a stop or ``%undo`` could not take back
    (the keeper's ``shared`` fact: ``{"count", "bytes", "names"}``), or no line when there are none."""
    if not isinstance(shared, dict) or not shared.get("count"):
        return []
    names = ", ".join(str(name) for name in shared.get("names", []))
    more = int(shared["count"]) - len(shared.get("names", []))
    names += f" and {more} more" if more > 0 else ""
    return [
        "cellbox: writes to shared memory (mmap MAP_SHARED, multiprocessing, shared_memory, memfd) stay as they "
        f"are, a stop or %undo cannot take them back: {format_size(int(shared.get('bytes', 0)))} in {names}"
    ]


def _undo_request(code: str) -> int | None:
    """The N of a cell that is only ``%undo`` or ``%undo N`` (0 for a bad N), else ``None``."""
    match = _UNDO.fullmatch(code)
    if match is None:
        return None
    text = match.group(1) or "1"
    return int(text) if text.isdigit() else 0


def _not_dumpable() -> None:
    """prctl(2) ``PR_SET_DUMPABLE`` 0: ptrace and /proc/PID/{mem,environ} only for CAP_SYS_PTRACE."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _without_note(content: dict[str, Any]) -> dict[str, Any]:
    """A cell's output ``content`` without :data:`NOTE_MIMETYPE` in its data: that mimetype is cellbox's own word."""
    data = content.get("data")
    if isinstance(data, dict) and NOTE_MIMETYPE in data:
        content["data"] = {key: value for key, value in data.items() if key != NOTE_MIMETYPE}
    return content


def _pick(message: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The ``keys`` of a child's message, each a dict as the messaging spec has them (anything else: empty)."""
    return {key: value if isinstance(value := message.get(key), dict) else {} for key in keys}


def _handled_interrupt(outcome: Outcome, cell: _Cell) -> Status | None:
    """How an interrupted cell that ended through its own ``KeyboardInterrupt`` handler ended, or ``None``.

    ``ok`` when it finished (exit status 0, no error); ``error`` when its
    handler raised an error of its own (a ``ValueError``, not the
    interrupt's ``KeyboardInterrupt``); ``None`` when the interrupt stopped
    it, or a kill did.
    """
    if outcome.status is not Status.INTERRUPTED or outcome.signal is not None:
        return None
    if outcome.exit_code == 0 and not cell.failed and not cell.errors:
        return Status.OK
    if outcome.exit_code == 1 and cell.failed and cell.failed["ename"] != "KeyboardInterrupt":
        return Status.ERROR
    return None


def _header(parent: Any) -> dict[str, Any]:
    """The header of a request as JSON text and numbers (its ``date`` as ISO 8601 text), for a cell's spec."""
    header = parent.get("header") if isinstance(parent, dict) else None
    if not isinstance(header, dict):
        return {}
    return {str(k): v.isoformat() if hasattr(v, "isoformat") else v for k, v in header.items()}


def _outcome_metadata(outcome: Outcome) -> dict[str, Any]:
    data = outcome.to_json()
    for key in ("stdout", "stderr"):
        data.pop(key, None)
    return data


def main() -> None:
    """Start the kernel: ``python -E -P -m cellbox.kernel -f CONNECTION_FILE`` (the kernelspec's flags).

    Whatever the flags, the folder it starts in (the notebook's, which cells
    write) leaves ``sys.path`` before anything else is imported
    (:func:`~cellbox.sandbox.importpath.trusted_sys_path`).
    """
    trusted_sys_path()
    from ipykernel.kernelapp import IPKernelApp
    from traitlets import DottedObjectName

    class CellboxKernelApp(IPKernelApp):  # type: ignore[misc]
        """ipykernel's application, whose exit after a ``shutdown_request`` waits for the control thread's last words.

        The request's handler stops the shell's loop and the control thread's.
        The main thread then leaves :meth:`start` and the interpreter exits,
        running its atexit handlers (IOPub's thread stops first) while the
        control thread (a daemon) may still be publishing the request's
        ``idle`` status through IOPub (``Kernel.process_control``): that send
        then blocks, ``IPKernelApp.close`` waits for the control thread, and
        the kernel lives on until jupyter_client terminates it (2.5 s after
        the request, half its ``shutdown_wait_time``).  Here the main thread
        waits for the control thread, already told to stop, before it exits.
        """

        # The kernel's own stdout and stderr (see KernelStream).
        outstream_class = DottedObjectName("cellbox.kernel.kernel.KernelStream").tag(config=True)

        def start(self) -> None:
            super().start()
            control = self.control_thread
            if getattr(self.kernel, "_shutdown_message", None) is not None and control is not None:
                control.join(CONTROL_STOP_TIMEOUT)

    CellboxKernelApp.launch_instance(kernel_class=CellboxKernel)
