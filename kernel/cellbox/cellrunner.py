"""Child side of the kernel: run one notebook cell with IPython, inside the sandbox.

The kernel starts ``python -m cellbox.cellrunner SPEC.json`` through
:func:`cellbox.sandbox.start` with ``channel=True`` for every cell.  This
process then:

1. loads the session's carried state (a cloudpickle file the previous cells'
   children wrote; only children ever unpickle it, design rule 6);
2. runs the cell with IPython's own :class:`InteractiveShell`, so magics,
   ``!cmd``, ``?``, ``_`` and ``%matplotlib inline`` behave as under ipykernel;
3. sends rich output, errors, pager payloads and input requests to the kernel
   as JSON lines on fd 3 (and reads input replies on fd 4); plain ``print``
   output goes to stdout/stderr, which the sandbox streams to the kernel;
4. when the cell succeeded, saves the names it can pickle to a new state file
   and tells the kernel, which moves it into place.

Exit status: 0 when the cell ran without an uncaught exception, 1 otherwise.

Messages on fd 3 (one JSON object per line, ``"type"`` first):
``display_data``, ``update_display_data``, ``clear_output``,
``execute_result``, ``error``, ``failed`` (the reply's ename and evalue),
``input_request``, ``payload``, ``user_expressions``, ``state``, ``memory_error``,
``transformed`` (the cell as IPython transformed it, which the kernel passes
back in later specs so their children need not transform all of history).
"""

from __future__ import annotations

import builtins
import getpass
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# Names IPython puts in every namespace; they are rebuilt, never carried.
_SHELL_NAMES = frozenset(
    {
        "__builtins__",
        "__builtin__",
        "__name__",
        "__doc__",
        "__package__",
        "__loader__",
        "__spec__",
        "In",
        "Out",
        "_ih",
        "_oh",
        "_dh",
        "get_ipython",
        "exit",
        "quit",
        "_i",
        "_ii",
        "_iii",
        "_sh",
    }
)
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
STATE_VERSION = 1


class Channel:
    """The JSON-lines channel to the kernel: fd 3 to write, fd 4 to read replies."""

    def __init__(self, spec: str | None) -> None:
        write_fd, read_fd = (int(part) for part in (spec or "3,4").split(","))
        # Buffered, so a write cut short (a signal during a large PNG) is completed by flush().
        self._out = os.fdopen(write_fd, "wb", closefd=False)
        self._in = os.fdopen(read_fd, "rb", buffering=0, closefd=False)

    def send(self, message: dict[str, Any]) -> None:
        """Write one message; stdout and stderr are flushed first to keep the order."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._out.write((json.dumps(message, default=repr) + "\n").encode())
        self._out.flush()

    def receive(self) -> dict[str, Any]:
        """Read one reply line (blocks); an empty dict when the kernel closed the channel."""
        line = self._in.readline()
        return json.loads(line) if line.strip() else {}


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
        channel.send({"type": "input_request", "prompt": str(prompt), "password": password})
        try:
            reply = channel.receive()
        except KeyboardInterrupt:
            # SIGINT while waiting for the answer: the same words as ipykernel's.
            raise KeyboardInterrupt("Interrupted by user") from None
        if reply.get("interrupted"):
            raise KeyboardInterrupt("Interrupted by user")
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


def _block_widgets() -> None:
    """Widgets need comms with a long-lived kernel; say so instead of showing a dead widget."""
    try:
        import comm
    except ImportError:
        return

    def create_comm(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841
        raise RuntimeError(
            "interactive widgets need a kernel process that lives between cells, and cellbox runs each cell "
            "in a new process; draw a static plot or print the values instead"
        )

    comm.create_comm = create_comm


# --------------------------------------------------------------------------- state


def _code_with_filename(constructor: Any, args: tuple[Any, ...], filename: str) -> Any:
    return constructor(*args).replace(co_filename=filename)


def _reduce_code(code: Any) -> tuple[Any, tuple[Any, ...]]:
    """Pickle a code object with its file name, which cloudpickle replaces by ``<dynamic-code>``.

    The name (IPython's name for the cell that defined it) lets tracebacks and
    ``??`` show the source of a function defined in an earlier cell.
    """
    import cloudpickle.cloudpickle as internals

    constructor, args = internals._code_reduce(code)
    return _code_with_filename, (constructor, args, code.co_filename)


def _dumps(value: Any) -> bytes:
    """cloudpickle, keeping code objects' file names."""
    import collections
    import io
    import types

    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        dispatch_table = collections.ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)

    buffer = io.BytesIO()
    Pickler(buffer).dump(value)
    return buffer.getvalue()


def _load_state(path: str | None) -> dict[str, Any]:
    """Read the carried state; a missing file is an empty state."""
    if not path or not os.path.exists(path):
        return {}
    import cloudpickle

    try:
        with open(path, "rb") as f:
            state = cloudpickle.load(f)
    except Exception as exc:  # noqa: BLE001 - a module the state names is gone, say
        print(
            f"cellbox: the names from earlier cells could not be loaded ({type(exc).__name__}: {exc}); "
            "this cell starts without them",
            file=sys.stderr,
        )
        return {}
    return state if isinstance(state, dict) and state.get("version") == STATE_VERSION else {}


def _namespace_from(state: dict[str, Any]) -> dict[str, Any]:
    """The user namespace to run in: the globals dict the carried functions share, refilled.

    cloudpickle gives every function it pickled from one namespace one shared
    new globals dict; using that dict as the namespace keeps ``def f(): return x``
    seeing later changes of ``x``, as in a long-lived kernel.
    """
    names: dict[str, Any] = state.get("names", {})
    shared = None
    for value in names.values():
        candidates = [value] + (list(vars(value).values()) if isinstance(value, type) else [])
        for item in candidates:
            item = getattr(item, "__func__", item)
            if getattr(item, "__module__", None) == "__main__" and isinstance(getattr(item, "__globals__", None), dict):
                shared = item.__globals__
                break
        if shared is not None:
            break
    namespace = shared if shared is not None else {}
    namespace.update(names)
    return namespace


def _restore(shell: Any, state: dict[str, Any], history: list[str], transformed: list[Any]) -> None:
    """Put In/Out, the environment, the working directory and extensions back.

    ``transformed[n]`` is input ``n`` as IPython transformed it when it ran
    (``None`` when its child did not say); the rest are transformed here.
    """
    # IPython resets _, __ and ___ when it builds the namespace: set them again,
    # in the display hook too, which stops updating them when they differ from its own.
    names = state.get("names", {})
    shell.user_ns.update(names)
    for under in ("_", "__", "___"):
        if under in names:
            setattr(shell.displayhook, under, names[under])
    hm = shell.history_manager
    parsed = [""]
    for number, source in enumerate(history[1:], 1):
        known = transformed[number] if number < len(transformed) else None
        cell = known if isinstance(known, str) else _transformed(shell, source)
        # Under the name IPython gave it when it ran: tracebacks and ?? find the source.
        shell.compile.cache(cell, number, raw_code=source)
        parsed.append(cell.rstrip("\n"))
    hm.input_hist_raw[:] = [source.rstrip("\n") for source in history]
    hm.input_hist_parsed[:] = parsed
    # _i, _ii, _iii and _iN as IPython's HistoryManager.store_inputs keeps them.
    earlier = parsed + ["", "", ""]
    hm._i00, hm._i, hm._ii = earlier[len(parsed) - 1], earlier[len(parsed) - 2], earlier[len(parsed) - 3]
    shell.user_ns.update({f"_i{n}": source for n, source in enumerate(parsed) if n})
    out = state.get("out", {})
    hm.output_hist.update(out)
    shell.user_ns.update({f"_{n}": value for n, value in out.items()})
    for key, value in state.get("environ", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    cwd = state.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    for name in state.get("extensions", []):
        try:
            shell.extension_manager.load_extension(name)
        except Exception as exc:  # noqa: BLE001 - one line, not a traceback, for an extension that went away
            print(f"cellbox: could not load extension {name} again: {exc}", file=sys.stderr)


def _transformed(shell: Any, source: str) -> str:
    try:
        return str(shell.transform_cell(source))
    except Exception:  # noqa: BLE001 - a cell IPython could not transform ran as it was
        return source


def _carried_names(shell: Any) -> dict[str, Any]:
    hidden = shell.user_ns_hidden
    keep_hidden = {"_", "__", "___"}
    names = {}
    for name, value in shell.user_ns.items():
        if name in _SHELL_NAMES or (name in hidden and name not in keep_hidden and hidden[name] is value):
            continue
        if name.startswith("_i") and name[2:].isdigit():
            continue  # rebuilt from In
        names[name] = value
    return names


def _picklable(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Split ``values`` into what cloudpickle can carry and ``{name: reason}`` for the rest."""

    try:
        _dumps(values)
        return values, {}
    except Exception:  # noqa: BLE001 - find out which names are the problem
        pass
    good, dropped = {}, {}
    for name, value in values.items():
        try:
            _dumps(value)
            good[name] = value
        except Exception as exc:  # noqa: BLE001
            dropped[name] = f"{type(value).__name__}: {type(exc).__name__}"
    return good, dropped


def _save_state(shell: Any, path: str, launch_environ: dict[str, str], extensions: list[str]) -> dict[str, str]:
    """Pickle what can be carried to ``path``; return ``{name: reason}`` of user names left out."""

    names, dropped = _picklable(_carried_names(shell))
    out, _ = _picklable(dict(shell.history_manager.output_hist))
    environ: dict[str, str | None] = {k: v for k, v in os.environ.items() if launch_environ.get(k) != v}
    environ.update({k: None for k in launch_environ if k not in os.environ})
    state = {
        "version": STATE_VERSION,
        "names": names,
        "out": out,
        "environ": environ,
        "cwd": os.getcwd(),
        "extensions": extensions,
    }
    with open(path, "wb") as f:
        f.write(_dumps(state))
    return {name: reason for name, reason in dropped.items() if not name.startswith("_")}


# --------------------------------------------------------------------------- main


def _prepare_process(spec: dict[str, Any]) -> None:
    """Environment tweaks before IPython or matplotlib are imported."""
    # As ipykernel does: figures go to the inline backend, shown at plt.show()
    # and at the end of the cell.
    # find_spec, not import: importing the backend would import matplotlib in every cell.
    inline = importlib.util.find_spec("matplotlib_inline") is not None
    os.environ["MPLBACKEND"] = INLINE_BACKEND if inline else "Agg"
    os.environ.setdefault("PAGER", "cat")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="jupyter_client")


class _NoChannel:
    """Where a shell built ahead of its cell sends: nowhere (it has no cell yet)."""

    def send(self, message: dict[str, Any]) -> None:
        pass


# A shell built ahead of its cell (warm_start), with who built it; taken by the cell once.
_warm: tuple[Any, tuple[int, str | None, str | None]] | None = None


def _builder() -> tuple[int, str | None, str | None]:
    """What a shell takes from its process when it is built: the user, and where IPython keeps its files."""
    return os.getuid(), os.environ.get("HOME"), os.environ.get("IPYTHONDIR")


def _new_shell(channel: Any, namespace: dict[str, Any]) -> Any:
    """IPython's shell for one cell: inline plots and the pager set up, nothing of the cell's own yet."""
    from .cellshell import make_shell

    shell = make_shell(channel, namespace)
    if "matplotlib" in sys.modules and os.environ["MPLBACKEND"] == INLINE_BACKEND:
        # matplotlib was imported before this process chose its backend (a warm
        # start): switch to inline the way %matplotlib inline does.
        shell.enable_matplotlib("inline")
    _install_pager(shell)
    return shell


def warm_start() -> None:
    """Build the next cell's shell before the cell is known; called in a fork server's spare.

    A fork server's spare (:mod:`cellbox._forkserver_child`) calls this while
    it waits for its run: building IPython's shell and running a first, empty
    cell through it costs about 15 ms, paid here while nobody waits.  The
    shell is new, built in this process for its one cell; when the cell comes,
    :func:`run` gives it the cell's channel, namespace, history and working
    directory.  A run under another user or home than the spare's builds a
    new shell instead.
    """
    global _warm
    from .cellshell import CellShell

    _prepare_process({})
    try:
        shell = _new_shell(_NoChannel(), {})
        shell.run_cell("pass", store_history=False, silent=True)
    except BaseException:
        CellShell.clear_instance()  # the cell builds its own, not this half-made singleton
        raise
    _warm = shell, _builder()


def _take_warm_shell(channel: Channel, namespace: dict[str, Any]) -> Any:
    """The shell :func:`warm_start` built, now the cell's (``None`` when there is none to take)."""
    global _warm
    if _warm is None:
        return None
    shell, builder = _warm
    _warm = None
    if builder != _builder():
        type(shell).clear_instance()  # make_shell builds a new one, not this singleton
        return None
    shell.channel = channel
    # The cell's namespace in place of the empty one, as IPython's embedding
    # swaps namespaces (IPython/terminal/embed.py), with the hidden names put back.
    shell.user_module, shell.user_ns = shell.prepare_user_module(None, namespace)
    shell.ns_table.update(user_global=shell.user_module.__dict__, user_local=shell.user_ns)
    shell.init_sys_modules()
    shell.init_user_ns()
    hook = shell.displayhook  # its __init__ put these in the first namespace
    shell.user_ns.update({"_": hook._, "__": hook.__, "___": hook.___})
    shell.Completer.namespace = shell.user_ns
    shell.Completer.global_namespace = shell.user_module.__dict__
    # The directory history starts in the cell's working directory, not the spare's.
    shell.history_manager.dir_hist[:] = [Path.cwd()]
    shell.starting_dir = os.getcwd()
    return shell


def _start_shell(channel: Channel, spec: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The cell's shell with the carried state in place, and the environment to diff ``%env`` against."""
    from . import magics

    state = _load_state(spec.get("state_in")) if spec.get("carry_state", True) else {}
    namespace = _namespace_from(state)
    shell = _take_warm_shell(channel, namespace)
    if shell is None:
        shell = _new_shell(channel, namespace)
    magics.register(shell, spec.get("limits", {}))
    _install_stdin(channel, bool(spec.get("allow_stdin")))
    _block_widgets()
    # %env changes are carried as a difference from this process's start.
    launch_environ = dict(os.environ)
    _restore(shell, state, list(spec.get("history", [""])), list(spec.get("transformed", [])))
    shell.execution_count = int(spec.get("execution_count", 1))
    return shell, launch_environ


def run(spec: dict[str, Any]) -> int:
    """Run the cell described by ``spec``; return the exit status (0 ok, 1 error)."""
    from .cellshell import json_ready

    channel = Channel(os.environ.get("CELLBOX_CHANNEL"))
    _prepare_process(spec)
    shell, launch_environ = _start_shell(channel, spec)
    store, silent = bool(spec.get("store_history", True)), bool(spec.get("silent"))
    if store:
        # Before the cell runs: a cell may change the transformers (or send its own message;
        # the kernel keeps the first).
        channel.send({"type": "transformed", "source": _transformed(shell, spec["code"])})
    result = shell.run_cell(spec["code"], store_history=store, silent=silent)
    payload = shell.payload_manager.read_payload()
    if payload:
        channel.send({"type": "payload", "payload": json_ready(payload)})
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        if isinstance(error, MemoryError):
            channel.send({"type": "memory_error"})
        # The reply's ename/evalue, also for errors IPython only prints (a UsageError).
        channel.send({"type": "failed", "ename": type(error).__name__, "evalue": str(error)})
        return 1
    if spec.get("user_expressions"):
        values = shell.user_expressions(spec["user_expressions"])
        channel.send({"type": "user_expressions", "value": json_ready(values)})
    if spec.get("carry_state", True) and spec.get("state_out"):
        extensions = sorted(shell.extension_manager.loaded)
        dropped = _save_state(shell, spec["state_out"], launch_environ, extensions)
        channel.send({"type": "state", "file": spec["state_out"], "dropped": dropped})
    return 0


def _end_process(status: int) -> None:
    """Leave now, without waiting for threads the cell started: they end with their cell."""
    import threading

    running = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if running:
        count = "1 thread was" if len(running) == 1 else f"{len(running)} threads were"
        print(f"cellbox: {count} still running when the cell ended, and stopped with it", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m cellbox.cellrunner SPEC.json``; ends the process with the cell's status."""
    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as f:
        spec = json.load(f)
    _end_process(run(spec))
    return 0  # not reached


if __name__ == "__main__":
    # Run from the imported module, so what it pickles names cellbox.cellrunner, not __main__.
    from cellbox.cellrunner import main as _main

    sys.exit(_main())
