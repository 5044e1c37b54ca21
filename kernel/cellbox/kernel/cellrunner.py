"""Child side of the kernel: run one notebook cell with IPython, inside the session's sandbox.

The kernel starts ``python -m cellbox.kernel.cellrunner SPEC.json`` through
:func:`cellbox.sandbox.start` with ``channel=True`` for every cell, forked from
the session's latest snapshot (:mod:`cellbox.sandbox.session`).  The snapshot is
the process image of the last cell that finished, so the cell finds every
name, module, open file and setting the earlier cells left, and IPython's
shell itself, as in a long-lived kernel.  This process then:

1. gives the session's shell this cell's channel, stdin and limits (or builds
   a shell, in the session's base snapshot or in a spawned cell);
2. runs the cell with IPython's own :class:`InteractiveShell`, so magics,
   ``!cmd``, ``?``, ``_`` and ``%matplotlib inline`` behave as under ipykernel;
3. sends rich output, errors, pager payloads and input requests to the kernel
   as JSON lines on fd 3 (and reads input replies on fd 4); plain ``print``
   output goes to stdout/stderr, which the sandbox streams to the kernel;
4. returns to the session's code, which forks the next snapshot from this
   process (its main thread only) when the cell finished, raised or not.

Nothing is pickled: no state crosses a process boundary as data, and the
kernel process never sees any of it.

Exit status: 0 when the cell ran without an uncaught exception, 1 otherwise.

Messages on fd 3 (one JSON object per line, ``"type"`` first):
``display_data``, ``update_display_data``, ``clear_output``,
``execute_result``, ``error``, ``failed`` (the reply's ename and evalue),
``input_request``, ``payload``, ``user_expressions``, ``memory_error``,
``transformed`` (the cell as IPython transformed it, which the kernel passes
back when a shell must be given the history, so it need not transform all of
it again), ``history_request`` (the shell's history is not the kernel's: the
reply names a file with the kernel's inputs and their transformed forms),
``comm`` (a widget's ``comm_open``, ``comm_msg`` or ``comm_close``; see
:mod:`cellbox.kernel.cellcomm`).  A spec with ``"comm"`` is a frontend's comm
message: it is handed to the comm manager instead of running code.

The spec names the history the cell's shell must have by its length and
digest (:func:`history_digest`), not by its inputs: a long notebook's spec
stays small, and the inputs cross only when the shell's differ (a cell that
was stopped, ``%undo``, a new shell).
"""

from __future__ import annotations

import builtins
import getpass
import hashlib
import importlib.util
import io
import json
import os
import queue
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Run from the imported module, whose globals (the session's shell) the snapshots keep; the rest
    # of this copy's body is not run (a millisecond of a cell's start: its classes and functions).
    from cellbox.kernel.cellrunner import main as _main

    sys.exit(_main())

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


class Channel:
    """The JSON-lines channel to the kernel: fd 3 to write, fd 4 to read replies."""

    def __init__(self, spec: str | None) -> None:
        write_fd, read_fd = (int(part) for part in (spec or "3,4").split(","))
        # Buffered, so a write cut short (a signal during a large PNG) is completed by flush().
        self._out = os.fdopen(write_fd, "wb", closefd=False)
        self._in = os.fdopen(read_fd, "rb", buffering=0, closefd=False)
        self.reply_fd = read_fd
        # While a debugged cell runs, its debugger's bridge reads fd 4 and puts here what is not DAP.
        self.replies: queue.Queue[dict[str, Any]] | None = None
        self._lock = threading.Lock()  # the debugger's bridge writes from a thread of its own

    def send(self, message: dict[str, Any]) -> None:
        """Write one message; stdout and stderr are flushed first to keep the order."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        line = (json.dumps(message, default=repr) + "\n").encode()
        # SIGINT waits until the line is out: a KeyboardInterrupt in the middle would leave half a line,
        # and the kernel drops a line that is not JSON, with the next message (the cell's error) joined to it.
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with self._lock:
                self._out.write(line)
                self._out.flush()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)

    def receive(self) -> dict[str, Any]:
        """Read one reply line (blocks); an empty dict when the kernel closed the channel."""
        if self.replies is not None:
            return self.replies.get()
        line = self._in.readline()
        return json.loads(line) if line.strip() else {}


class ChannelStream(io.TextIOBase):
    """A cell's ``sys.stdout`` or ``sys.stderr``: each write is a ``stream`` message on the channel.

    Text printed from Python then reaches the kernel in the one order the cell
    produced it, with its displays and errors (two pipes read side by side
    cannot tell which was written first).  What a subprocess or ``os.write``
    writes to the file descriptor still goes through the pipe.  The kernel
    counts both against the cell's output limit.
    """

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name: str, fd: int) -> None:
        super().__init__()
        self._name = name
        self._fd = fd
        self.channel: Channel | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"<{self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    @property
    def buffer(self) -> _BytesToText:
        return _BytesToText(self)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            clean = text.encode("utf-8", "replace").decode("utf-8")
            if self.channel is not None:
                self.channel.send({"type": "stream", "name": self._name, "text": clean})
            else:
                os.write(self._fd, clean.encode())
        return len(text)


class _BytesToText:
    """``sys.stdout.buffer`` of a :class:`ChannelStream`: bytes written are decoded (UTF-8, replaced)."""

    def __init__(self, stream: ChannelStream) -> None:
        self._stream = stream

    def write(self, data: bytes) -> int:
        self._stream.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        pass


def _install_streams(channel: Channel) -> None:
    """The cell's ``sys.stdout`` and ``sys.stderr`` write to ``channel`` (made once, kept by the snapshots)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if not isinstance(stream, ChannelStream):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
            stream = ChannelStream(name, fd)
            setattr(sys, name, stream)
        stream.channel = channel


def _install_pager(shell: Any) -> None:
    """``?``, ``??`` and ``%pdoc`` go to the execute reply's payload, as under ipykernel."""
    from IPython.core import page

    def payload_page(strng: Any, start: int = 0, screen_lines: int = 0, pager_cmd: Any = None) -> None:
        data = strng if isinstance(strng, dict) else {"text/plain": strng}
        shell.payload_manager.write_payload({"source": "page", "data": data, "start": max(0, start)})

    shell.set_hook("show_in_pager", page.as_hook(payload_page), 99)


def _install_stdin(channel: Channel, allow_stdin: bool) -> None:
    """``input()`` and ``getpass`` ask the frontend through the kernel, or fail at once."""
    from IPython.core.error import StdinNotImplementedError

    def ask(prompt: Any, password: bool) -> str:
        __tracebackhide__ = True  # noqa: F841
        if not allow_stdin:
            what = "getpass" if password else "raw_input"
            raise StdinNotImplementedError(f"{what} was called, but this frontend does not support input requests.")
        try:
            channel.send({"type": "input_request", "prompt": str(prompt), "password": password})
            reply = channel.receive()
        except KeyboardInterrupt:
            # SIGINT while asking or waiting, the same words as ipykernel's. The kernel never answers an
            # interrupted request: the signal alone ends it, so one interrupt is one KeyboardInterrupt.
            raise KeyboardInterrupt("Interrupted by user") from None
        if "error" in reply:
            raise StdinNotImplementedError(str(reply["error"]))
        if reply.get("eof") or "value" not in reply:
            raise EOFError
        return str(reply["value"])

    def input(prompt: Any = "") -> str:  # noqa: A001 - replaces the builtin on purpose
        __tracebackhide__ = True  # noqa: F841
        return ask(prompt, False)

    def getpass_(prompt: str = "Password: ", stream: Any = None) -> str:
        __tracebackhide__ = True  # noqa: F841
        return ask(prompt, True)

    builtins.input = input
    getpass.getpass = getpass_


# --------------------------------------------------------------------------- history


def history_digest(entries: list[str], start: str = "") -> str:
    """The digest of history ``entries`` (each without its trailing newlines), chained on ``start``.

    SHA-1 of the previous digest and the entry, entry by entry, so the kernel
    and a shell keep it as their histories grow.  Not a secret: a cell may
    forge it, and only its own ``In`` is then wrong.
    """
    digest = start
    for entry in entries:
        digest = hashlib.sha1(f"{digest}\0{entry.rstrip(chr(10))}".encode()).hexdigest()
    return digest


def _shell_history(shell: Any) -> tuple[int, str]:
    """``(entries, digest)`` of the shell's ``In`` (IPython's ``input_hist_raw``), its digests kept as it grows."""
    raw = shell.history_manager.input_hist_raw
    digests: list[str] = getattr(shell, "cellbox_history_digests", [])
    if len(digests) > len(raw):
        digests = []
    for entry in raw[len(digests) :]:
        digests.append(history_digest([entry], digests[-1] if digests else ""))
    shell.cellbox_history_digests = digests
    return len(raw), digests[-1] if digests else ""


def _history_from_kernel(shell: Any, channel: Channel, spec: dict[str, Any]) -> tuple[list[str], list[Any]] | None:
    """The kernel's inputs and their transformed forms, when the spec's digest is not the shell's; else ``None``."""
    if _shell_history(shell) == (spec.get("history_length"), spec.get("history_digest")):
        return None
    channel.send({"type": "history_request"})
    reply = channel.receive()
    path = reply.get("path")
    if not isinstance(path, str):
        return None  # the kernel did not give it: this cell's In stays the shell's
    with open(path, encoding="utf-8") as f:
        given = json.load(f)
    return list(given.get("history", [""])), list(given.get("transformed", []))


def _sync_history(shell: Any, history: list[str], transformed: list[Any]) -> None:
    """Make the shell's ``In`` the kernel's, when they differ (a new shell, or a state undone with ``%undo``).

    ``transformed[n]`` is input ``n`` as IPython transformed it when it ran
    (``None`` when its child did not say); the rest are transformed here.
    """
    hm = shell.history_manager
    if [source.rstrip("\n") for source in history] == hm.input_hist_raw:
        return
    parsed = [""]
    for number, source in enumerate(history[1:], 1):
        known = transformed[number] if number < len(transformed) else None
        cell = known if isinstance(known, str) else _transformed(shell, source)
        # Under the name IPython gave it when it ran: tracebacks and ?? find the source.
        shell.compile.cache(cell, number, raw_code=source)
        parsed.append(cell.rstrip("\n"))
    hm.input_hist_raw[:] = [source.rstrip("\n") for source in history]
    shell.cellbox_history_digests = []
    hm.input_hist_parsed[:] = parsed
    # _i, _ii, _iii and _iN as IPython's HistoryManager.store_inputs keeps them.
    earlier = parsed + ["", "", ""]
    hm._i00, hm._i, hm._ii = earlier[len(parsed) - 1], earlier[len(parsed) - 2], earlier[len(parsed) - 3]
    shell.user_ns.update({f"_i{n}": source for n, source in enumerate(parsed) if n})


def _transformed(shell: Any, source: str) -> str:
    try:
        return str(shell.transform_cell(source))
    except Exception:  # noqa: BLE001 - a cell IPython could not transform ran as it was
        return source


# --------------------------------------------------------------------------- main


def _prepare_process(spec: dict[str, Any]) -> None:
    """Environment tweaks before IPython or matplotlib are imported."""
    # As ipykernel does: figures go to the inline backend, shown at plt.show()
    # and at the end of the cell.
    os.environ["MPLBACKEND"] = chosen_backend or (INLINE_BACKEND if _inline_backend_installed() else "Agg")
    os.environ.setdefault("PAGER", "cat")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="jupyter_client")


# The backend a cell chose with %matplotlib widget (ipympl's), kept by the snapshots: each forked run sets its
# backend again from MPLBACKEND (cellbox.sandbox.snapshots.prepare_entry), which must then name this one.
chosen_backend: str | None = None


def choose_backend(backend: str | None) -> None:
    """The backend later runs keep (``None``: the inline backend); called by ``%matplotlib``."""
    global chosen_backend
    chosen_backend = backend


# Whether matplotlib_inline is installed: looked up once per session (in its keeper), not in every cell.
# A package installed since gives a new session (see cellbox.sandbox.session), which looks again.
_inline_installed: bool | None = None


def _inline_backend_installed() -> bool:
    global _inline_installed
    if _inline_installed is None:
        # find_spec, not import: importing the backend would import matplotlib in every cell.
        _inline_installed = importlib.util.find_spec("matplotlib_inline") is not None
    return _inline_installed


def prepare_process() -> None:
    """What this module sets before IPython or matplotlib are imported; the session's keeper calls it.

    The keeper imports this module first and calls this before its other
    preloads (:func:`cellbox.sandbox.snapshots.preload`), and again in each
    cell's process forked from a snapshot.
    """
    _prepare_process({})


def _set_user_shell(shell: str) -> None:
    """``SHELL`` as the kernel has it, so ``!cmd`` runs in the user's shell as under ipykernel.

    IPython's ``system`` runs commands with ``$SHELL`` (``sh`` when unset); a
    shell this sandbox cannot run is left out, so ``!cmd`` falls back to ``sh``
    rather than failing.
    """
    if shell and os.path.isabs(shell) and os.access(shell, os.X_OK):
        os.environ["SHELL"] = shell
    else:
        os.environ.pop("SHELL", None)


class _NoChannel:
    """Where a shell built ahead of its cell sends: nowhere (it has no cell yet)."""

    def send(self, message: dict[str, Any]) -> None:
        pass


# The session's shell: built once (in the base snapshot, by warm_start, or by
# the first cell), then inherited by every cell forked from a snapshot.
_shell: Any = None


def _new_shell(channel: Any) -> Any:
    """IPython's shell for the session: inline plots and the pager set up, nothing of a cell's own yet."""
    from .cellshell import make_shell

    shell = make_shell(channel, {})
    if "matplotlib" in sys.modules and os.environ["MPLBACKEND"] == INLINE_BACKEND:
        # matplotlib was imported before this process chose its backend: switch
        # to inline the way %matplotlib inline does.
        shell.enable_matplotlib("inline")
    _install_pager(shell)
    # Before any cell imports ipywidgets, which registers its comm targets with the manager when imported.
    from . import cellcomm

    cellcomm.install()
    cellcomm.lazy_kernel_shell_module()
    from . import leftwork

    leftwork.install()
    return shell


def _new_shell_of_the_session(channel: Channel) -> Any:
    """The session's shell, built by a cell's process because the base could not (or a spawned cell's).

    The fork handlers its imports register (logging's, IPython's history's,
    ``concurrent.futures``') are the session's own, as when the base builds the
    shell (:func:`warm_start`), not the cell's: they count as the base's
    (:data:`cellbox.sandbox.atfork.at_base`).  Else a session whose warm start
    failed (as root without bubblewrap, the syscall filter refuses the chmod
    of IPython's profile README) would keep every later cell's snapshot a copy
    (:func:`cellbox.sandbox.snapshots.own_snapshot_problem`): two forks and an
    exit on each cell's path.
    """
    from ..sandbox import atfork

    before = atfork.registered
    shell = _new_shell(channel)
    atfork.at_base += atfork.registered - before
    return shell


def warm_start() -> None:
    """Build the session's shell before any cell is known; called once, in the session's base snapshot.

    Building IPython's shell and running a first, empty cell through it costs
    tens of milliseconds, paid here while the kernel starts.  Every cell of the
    session then runs in this shell's copies (see :mod:`cellbox.sandbox.snapshots`).
    """
    global _shell
    from .cellshell import CellShell

    _prepare_process({})
    try:
        shell = _new_shell(_NoChannel())
        shell.run_cell("pass", store_history=False, silent=True)
        # Completion's and inspection's first-call costs, paid once here for every run beside the state.
        from .besiderunner import warm_up

        warm_up(shell)
    except BaseException:
        CellShell.clear_instance()  # the first cell builds its own, not this half-made singleton
        raise
    # Its first cell's directory history starts where the cells run.
    shell.history_manager.dir_hist[:] = []
    _shell = shell


def _forget_dead_threads(shell: Any) -> None:
    """Let go of IPython's helpers whose thread stayed behind in an earlier cell's process.

    A snapshot is a fork(2) of its cell's main thread only.  ``%%bash`` and the
    other script magics run their subprocesses on an event loop in a thread
    of their own, made once: in a later cell that thread is gone, so the loop
    is dropped and the magic makes a new one.
    """
    script = shell.magics_manager.registry.get("CellScriptMagics")
    if script is None or getattr(script, "event_loop", None) is None:
        return
    finalizer = getattr(script, "_event_loop_finalizer", None)
    if finalizer is not None:
        finalizer.detach()  # its thread cannot be joined here
    script._event_loop_finalizer = None
    script.event_loop = None


def _session_shell(channel: Channel, spec: dict[str, Any]) -> Any:
    """The session's shell, now this cell's: its channel, stdin, limits and history."""
    from ..sandbox.importpath import add_working_directory
    from . import cellcomm, magics

    global _shell
    if _shell is None:
        _shell = _new_shell_of_the_session(channel)
    shell = _shell
    _forget_dead_threads(shell)
    shell.channel = channel
    if not shell.history_manager.dir_hist:
        shell.history_manager.dir_hist.append(Path.cwd())
        shell.starting_dir = os.getcwd()
    if not getattr(shell, "cellbox_path_added", False):
        # The cells' own process, never the session's: they import from the notebook folder as
        # under ipykernel, once per shell (a cell that removes the entry is not given it back).
        add_working_directory()
        shell.cellbox_path_added = True
    magics.register(shell, spec.get("limits", {}))
    cellcomm.install()  # again: a cell may have imported ipykernel's own comm machinery over it
    _settle_left_work()
    _install_stdin(channel, bool(spec.get("allow_stdin")))
    given = _history_from_kernel(shell, channel, spec)
    if given is not None:
        _sync_history(shell, *given)
    shell.execution_count = int(spec.get("execution_count", 1))
    shell.parent_header = dict(spec.get("parent") or {})
    shell.config.IPKernelApp.connection_file = str(spec.get("connection_file") or "")
    _main_is_the_notebook(shell)
    return shell


def _main_is_the_notebook(shell: Any) -> None:
    """``sys.modules["__main__"]`` is the notebook's namespace, as IPython's ``init_sys_modules`` makes it.

    The session runs this module as ``__main__`` (``python -m``), which hides
    the shell's module: pickle, multiprocessing, shelve, dataclasses and typing
    look a notebook's classes and functions up through ``__module__ ==
    "__main__"``, and they must find the notebook's, not the runner's.
    """
    sys.modules["__main__"] = shell.user_module


def run(spec: dict[str, Any]) -> int:
    """Run the cell described by ``spec``; return the exit status (0 ok, 1 error)."""
    from .cellshell import json_ready

    channel = Channel(os.environ.get("CELLBOX_CHANNEL"))
    _prepare_process(spec)
    _set_user_shell(str(spec.get("shell") or ""))
    _install_streams(channel)
    shell = _session_shell(channel, spec)
    if isinstance(spec.get("comm"), dict):
        # A frontend's comm message between cells: handed to the comm manager, as ipykernel's handlers do.
        from . import cellcomm

        return cellcomm.dispatch(shell, spec["comm"])
    store, silent = bool(spec.get("store_history", True)), bool(spec.get("silent"))
    if store:
        # Before the cell runs: a cell may change the transformers (or send its own message;
        # the kernel keeps the first).
        channel.send({"type": "transformed", "source": _transformed(shell, spec["code"])})
    shell.displayhook_error = None
    shell.displayhook.active = False
    result = _run_cell(shell, channel, spec, store, silent)
    _shell_history(shell)  # its digest now, for the next cell's check (in the snapshot this process leaves)
    payload = shell.payload_manager.read_payload()
    shell.payload_manager.clear_payload()  # the shell lives on: as ipykernel, each reply has its cell's own
    if payload:
        channel.send({"type": "payload", "payload": json_ready(payload)})
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        if isinstance(error, MemoryError):
            channel.send({"type": "memory_error"})
        # The reply's ename/evalue, also for errors IPython only prints (a UsageError).
        channel.send({"type": "failed", "ename": type(error).__name__, "evalue": str(error)})
        return 1
    if shell.displayhook_error is not None:
        ename, evalue = shell.displayhook_error
        channel.send({"type": "failed", "ename": ename, "evalue": evalue})
        return 1
    if spec.get("user_expressions"):
        values = shell.user_expressions(spec["user_expressions"])
        channel.send({"type": "user_expressions", "value": json_ready(values)})
    return 0


def _run_cell(shell: Any, channel: Channel, spec: dict[str, Any], store: bool, silent: bool) -> Any:
    """Run the cell's code in the shell; under the debugger when the spec says so (:mod:`.debugcell`)."""
    if not isinstance(spec.get("debug"), dict):
        return shell.run_cell(spec["code"], store_history=store, silent=silent)
    from IPython.core.inputtransformer2 import leading_empty_lines

    from .cellnames import cell_file_name
    from .cellshell import cells_folder
    from .debugcell import Bridge

    # As ipykernel while debugging: leading empty lines stay, so the lines are the ones the breakpoints name.
    cleanup = shell.input_transformer_manager.cleanup_transforms
    removed = cleanup.index(leading_empty_lines) if leading_empty_lines in cleanup else None
    if removed is not None:
        cleanup.pop(removed)
    code, source = spec["code"], spec["debug"].get("source")
    if isinstance(source, str) and source != code and source.endswith(code):
        # The cell had a %%limits line, which the kernel took off: empty lines stand for it, so the lines are
        # the ones JupyterLab's breakpoints name, under the name it computed from the whole cell (dumpCell).
        code = "\n" * source[: len(source) - len(code)].count("\n") + code
        shell.compile.name_override = cell_file_name(source, cells_folder())
    bridge = Bridge(channel, spec["debug"])
    try:
        try:
            bridge.start()
        except Exception as exc:  # noqa: BLE001 - the cell still runs, and the kernel says it was not debugged
            bridge.stop()
            # The kernel writes the note's words (a cell could send this message too); the cause goes to stderr.
            print(f"debugger: {type(exc).__name__}: {exc}", file=sys.stderr)
            channel.send({"type": "debugger_failed"})
            return shell.run_cell(code, store_history=store, silent=silent)
        try:
            return shell.run_cell(code, store_history=store, silent=silent)
        finally:
            bridge.stop()
    finally:
        shell.compile.name_override = None
        if removed is not None:
            cleanup.insert(removed, leading_empty_lines)


def _settle_left_work() -> None:
    """What earlier cells left running, and which ended with them, answers at once (see :mod:`.leftwork`)."""
    from . import leftwork

    try:
        leftwork.start_cell()
    except Exception:  # noqa: BLE001 - a cell's own objects, changed by it: they are its to mend
        pass


def _warn_threads(count: int) -> None:
    """Say once that threads the cell left running end with it (a snapshot keeps the main thread only).

    Said on the channel as a count, which the kernel turns into its note where
    graders do not score it: never on the cell's stderr.  Idle threads of a thread pool are
    not named: the pool starts new ones in the next cell (:mod:`.leftwork`).
    """
    import threading

    from . import leftwork

    try:
        idle = leftwork.end_cell(count)
    except Exception:  # noqa: BLE001 - as in _settle_left_work
        idle = set()
    running = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive() and t not in idle
    ]
    if running:
        channel = getattr(_shell, "channel", None)
        if channel is not None:
            # A number only: the kernel writes the note (a cell can send on this channel too).
            channel.send({"type": "threads_left", "count": len(running)})
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _in_session() -> bool:
    """``True`` in a run the session forked to leave a snapshot: its code takes over when the cell returns."""
    snapshots = sys.modules.get("cellbox.sandbox.snapshots")
    return bool(getattr(snapshots, "SNAPSHOT", False))


def main(argv: list[str] | None = None) -> int:
    """``python -m cellbox.kernel.cellrunner SPEC.json``: returns or ends the process with the cell's status.

    In a session's run it returns the status, and the session forks the next
    snapshot; spawned, it leaves at once without waiting for the cell's threads.
    """
    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as f:
        spec = json.load(f)
    status = run(spec)
    _warn_threads(int(spec.get("execution_count", 0)))
    if _in_session():
        return status
    os._exit(status)
