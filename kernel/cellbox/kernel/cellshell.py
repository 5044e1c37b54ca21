"""IPython's shell with cellbox's plumbing, for the child that runs one cell.

Imported only in a cell's child (by :mod:`cellbox.kernel.cellrunner`), never by the
kernel process.  The shell is IPython's own :class:`InteractiveShell`; what
changes is where things go:

* ``display(...)`` and the last expression's value become ``display_data`` and
  ``execute_result`` messages on the channel (the bundles of every
  ``_repr_*_`` method, PNG bytes as base64, as ipykernel sends them);
* an exception's traceback becomes one ``error`` message;
* cells are named like files, as under ipykernel (see :class:`CellCompiler`).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import tempfile
from typing import Any, Protocol

from IPython.core import magic_arguments
from IPython.core.compilerop import CachingCompiler
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import cell_magic, magics_class
from IPython.core.magics.script import ScriptMagics, script_args
from IPython.utils.process import arg_split
from traitlets import Any as AnyTrait
from traitlets import Type
from traitlets.config import Config

from .cellnames import cell_file_name

__all__ = ["make_shell", "json_ready", "CellShell"]


class Sender(Protocol):
    def send(self, message: dict[str, Any]) -> None: ...


def json_ready(value: Any) -> Any:
    """Make a display bundle JSON-ready: bytes (a PNG) become base64 text, as ipykernel sends them."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class ChannelDisplayPublisher(DisplayPublisher):
    """``display(...)`` and IPython.display objects: one ``display_data`` message each."""

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):  # type: ignore[no-untyped-def, override]
        __tracebackhide__ = True  # noqa: F841 - read by IPython's traceback formatter
        self.shell.channel.send(  # type: ignore[union-attr]
            {
                "type": "update_display_data" if update else "display_data",
                "data": json_ready(data),
                "metadata": json_ready(metadata or {}),
                "transient": json_ready(transient or {}),
            }
        )

    def clear_output(self, wait: bool = False) -> None:
        self.shell.channel.send({"type": "clear_output", "wait": bool(wait)})  # type: ignore[union-attr]


class ChannelDisplayHook(DisplayHook):
    """The value of a cell's last expression: one ``execute_result`` message."""

    _bundle: dict[str, Any] = {}
    # True while the last value is formatted: a traceback shown then fails the cell (as ipykernel's does).
    active = False

    def start_displayhook(self) -> None:
        self._bundle = {}
        self.active = True

    def write_output_prompt(self) -> None:
        pass  # no "Out[n]:" on stdout; the frontend shows the prompt

    def write_format_data(self, format_dict, md_dict=None) -> None:  # type: ignore[no-untyped-def, override]
        self._bundle = {"data": json_ready(format_dict), "metadata": json_ready(md_dict or {})}

    def finish_displayhook(self) -> None:
        if self._bundle.get("data"):
            message = {"type": "execute_result", "execution_count": self.prompt_count, **self._bundle}
            self.shell.channel.send(message)  # type: ignore[union-attr]
        self._bundle = {}
        self.active = False


class CellCompiler(CachingCompiler):
    """Names cells like files, as ipykernel does, in a directory that stays the same all session.

    A path-like name (rather than ``<ipython-input-...>``) makes IPython's
    tracebacks format frames as they do under ipykernel; a fixed directory
    (the task directory's tmp/) lets code carried from an earlier cell find
    its source again.  The name is ipykernel's (MurmurHash2 of the cell's raw
    text, :mod:`cellbox.kernel.cellnames`), which JupyterLab's debugger
    computes too to find the cell a breakpoint or a stopped frame is in.
    """

    # The name of the cell being run when it is not its code's (a debugged cell whose %%limits line the kernel
    # took off: JupyterLab named it from the whole cell); set and cleared by the cell runner.
    name_override: str | None = None

    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        return self.name_override or cell_file_name(raw_code, cells_folder())


def cells_folder() -> str:
    """Where this process's cells are named: ``TMPDIR/cells`` (the kernel's debugInfo gives the same folder)."""
    # TMPDIR as this process has it (tempfile caches the first answer, perhaps a warm start's).
    return os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), "cells")


_CELLBOX_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _without_trailing_cellbox_frames(tb: Any) -> Any:
    """Cut the frames of cellbox's own code off the end of a traceback.

    An exception raised inside cellbox's replacements (``input()`` waiting on the
    kernel when the user interrupts) would otherwise end the student's traceback
    with cellbox's source lines: IPython always shows the last frame, even one
    marked ``__tracebackhide__``.  Frames of the user's code are never cut.
    """
    last_user = None
    node = tb
    while node is not None:
        if not node.tb_frame.f_code.co_filename.startswith(_CELLBOX_DIR):
            last_user = node
        node = node.tb_next
    if last_user is not None:
        last_user.tb_next = None
    return tb


class CellKernel:
    """``get_ipython().kernel``: what libraries read of ipykernel's kernel object, from a cell's process.

    Libraries take the attribute's presence (``hasattr(ip, "kernel")``,
    ``ip.has_trait("kernel")``) to mean a notebook's kernel (pandas, notebook helpers);
    ipywidgets' ``Output`` and others read the request the cell answers
    through :meth:`get_parent`.  The kernel process itself is out of a cell's
    reach: this object holds only what the cell's spec gave.
    """

    implementation = "cellbox"

    def __init__(self, shell: CellShell) -> None:
        self.shell = shell

    def get_parent(self, channel: str | None = None) -> dict[str, Any]:
        """The ``execute_request`` this cell answers (its ``header`` only), as ``Kernel.get_parent`` gives it."""
        return dict(self.shell.parent_header)

    @property
    def _parent_header(self) -> dict[str, Any]:
        # Older ipykernel releases kept the request here, and some widget code still reads it.
        return self.get_parent()


class CellShell(InteractiveShell):
    """IPython's shell whose display, results and errors go to :attr:`channel`.

    It answers as ipykernel's ``ZMQInteractiveShell`` to the checks libraries
    make to know they run in a notebook's kernel (see :data:`KERNEL_IDENTITY`):
    its class's name and module, ``IPKernelApp`` in its config, a ``kernel``
    trait (:class:`CellKernel`) and ``parent_header``.
    """

    channel = AnyTrait(help="where messages to the kernel go: an object with send(dict)")
    kernel = AnyTrait(help="what libraries read of the kernel: a CellKernel")
    parent_header = AnyTrait({}, help="the execute_request this cell answers (its header), as ipykernel's shell has it")
    compiler_class = Type(CellCompiler)
    display_pub_class = Type(ChannelDisplayPublisher)
    displayhook_class = Type(ChannelDisplayHook)

    def _get_exc_info(self, exc_tuple=None):  # type: ignore[no-untyped-def]
        etype, evalue, tb = super()._get_exc_info(exc_tuple)
        return etype, evalue, _without_trailing_cellbox_frames(tb)

    # (ename, evalue) of an exception raised while the cell's last value was formatted (a broken __repr__),
    # which IPython shows and swallows; ipykernel's reply is then an error, and so is the runner's.
    displayhook_error: tuple[str, str] | None = None

    def _showtraceback(self, etype, evalue, stb):  # type: ignore[no-untyped-def]
        if getattr(self.displayhook, "active", False):
            self.displayhook_error = (etype.__name__, str(evalue))
        self.channel.send({"type": "error", "ename": etype.__name__, "evalue": str(evalue), "traceback": list(stb)})

    def get_parent(self) -> dict[str, Any]:
        """The request this cell answers, as ``ZMQInteractiveShell.get_parent`` gives it."""
        return dict(self.parent_header)

    def ask_exit(self) -> None:
        # As ipykernel: the frontend decides what exit() means (JupyterLab shuts the kernel down).
        assert self.payload_manager is not None
        self.payload_manager.write_payload({"source": "ask_exit", "keepkernel": False})

    def init_environment(self) -> None:
        """The variables ipykernel's shell sets for programs a cell starts (TERM, PAGER=cat, colours).

        The same values as ``ipykernel.zmqshell.ZMQInteractiveShell.init_environment``, set here
        without importing that module (see :data:`KERNEL_MAGICS`).
        """
        os.environ.update(KERNEL_ENVIRONMENT)

    def init_virtualenv(self) -> None:
        pass  # the kernel's interpreter is the cells' interpreter; no virtualenv guessing

    def enable_gui(self, gui=None):  # type: ignore[no-untyped-def]
        if gui not in (None, "inline"):
            raise UsageError(f"%gui {gui} needs a kernel process that lives between cells; cellbox shows plots inline")

    def enable_matplotlib(self, gui=None):  # type: ignore[no-untyped-def]
        """``%matplotlib NAME``: as IPython's, but an interactive backend is refused before anything changes."""
        from IPython.core import pylabtools

        from . import cellrunner

        try:
            loop, backend = pylabtools.find_gui_and_backend(gui, self.pylab_gui_select)
        except (RuntimeError, ValueError):
            loop, backend = None, None  # an unknown name: IPython's own error, below
        if loop is not None:
            raise UsageError(interactive_plots_refusal(str(gui)))
        widget = gui in WIDGET_BACKENDS or backend == IPYMPL_BACKEND
        if widget and not _installed("ipympl"):
            raise UsageError(WIDGET_BACKEND_MISSING.format(name=gui))
        result = super().enable_matplotlib(gui)
        # Later runs forked from this state set their backend again (see cellrunner.chosen_backend).
        cellrunner.choose_backend((backend or IPYMPL_BACKEND) if widget else None)
        return result

    def init_magics(self) -> None:
        """IPython's magics, ipykernel's (``%autosave``, ``%less``...), and a ``%%script`` that names the PATH.

        ipykernel's are declared the way IPython declares its own
        (``MagicsManager.register_lazy``): listed by ``%lsmagic`` at once, their
        module imported the first time one is used (see :data:`KERNEL_MAGICS`).
        """
        super().init_magics()
        # ipykernel's own shell registers these and the %ed alias (ZMQInteractiveShell.init_magics).
        for name in KERNEL_MAGICS:
            self.magics_manager.register_lazy(name, "ipykernel.zmqshell:KernelMagics", "line")
        self.magics_manager.register_alias("ed", "edit")
        self.magics_manager.registry.pop(ScriptMagics.__name__, None)
        self.register_magics(CellScriptMagics)

    @property
    def db(self) -> Any:  # type: ignore[override]
        """``%store``'s database, in the notebook folder's ``.ipython/profile_default/db``; see :data:`STORE_DIR`."""
        if self._db is None:
            from IPython.external.pickleshare import PickleShareDB

            self._db = PickleShareDB(os.path.join(self.starting_dir, STORE_DIR))  # type: ignore[assignment]
        return self._db

    @db.setter
    def db(self, value: Any) -> None:
        self._db = value


# What libraries compare to know they run in a notebook's kernel (rich, tqdm, and many notebook helpers test the
# class's name; pandas and others "zmq" in str(type(shell))): the names of ipykernel's shell class.
KERNEL_IDENTITY = ("ipykernel.zmqshell", "ZMQInteractiveShell")
CellShell.__module__, CellShell.__name__ = KERNEL_IDENTITY
CellShell.__qualname__ = CellShell.__name__

# The line magics of ipykernel.zmqshell.KernelMagics (ipykernel 6 and 7), declared lazily by CellShell.init_magics:
# importing that module brings jupyter_client and zmq along, about 90 ms of the session's start
# that would hold up its first cell.
KERNEL_MAGICS = ("edit", "clear", "less", "more", "man", "connect_info", "qtconsole", "autosave", "subshell")

# The environment ipykernel's shell gives the programs a cell starts (ZMQInteractiveShell.init_environment):
# colours for ls and the tools that support them, and no pager, which cannot work without a terminal.
KERNEL_ENVIRONMENT = {
    "TERM": "xterm-color",
    "CLICOLOR": "1",
    "FORCE_COLOR": "1",
    "CLICOLOR_FORCE": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
}

# Where %store keeps its values, under the notebook folder (the cells' first working directory).
# ipykernel keeps them in ~/.ipython/profile_default/db; a cell cannot see the user's home, and its own
# HOME goes with the session, so the notebook folder is the one place they outlive a restart.
STORE_DIR = os.path.join(".ipython", "profile_default", "db")


# %matplotlib widget (and ipympl): figures as widgets, over comms, when ipympl is installed.
WIDGET_BACKENDS = ("widget", "ipympl")
IPYMPL_BACKEND = "module://ipympl.backend_nbagg"
WIDGET_BACKEND_MISSING = (
    "%matplotlib {name} needs the ipympl package, which is not installed here (pip install ipympl, then restart "
    "the kernel); figures stay inline images"
)


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def interactive_plots_refusal(name: str) -> str:
    """The sentence ``%matplotlib NAME`` gives for a backend that needs a live kernel process (notebook, qt...)."""
    return (
        f"%matplotlib {name} makes figures you can zoom and pan, which need one kernel process that stays alive "
        "between cells; cellbox runs every cell in a new process, so it shows figures as images: use "
        "%matplotlib inline"
    )


@magics_class
class CellScriptMagics(ScriptMagics):
    """IPython's ``%%script`` (and ``%%bash``, ``%%perl``...), saying which PATH a missing program was looked for on."""

    @magic_arguments.magic_arguments()
    @script_args
    @cell_magic("script")  # type: ignore[arg-type]
    def shebang(self, line: str, cell: str) -> Any:
        """Run a cell via a shell command, as IPython's ``%%script`` (see ``ScriptMagics.shebang``)."""
        argv = arg_split(line, posix=True)
        args, command = self.shebang.parser.parse_known_args(argv)
        if command and shutil.which(command[0]) is None:
            # As IPython's shebang does before it looks for the program: --out and --err name empty text.
            for name in (args.out, args.err):
                if name and self.shell is not None:
                    self.shell.user_ns[name] = ""
            # IPython's words, then where a cell looks: its PATH is the session's, not the user's shell's.
            print(f"Couldn't find program: {command[0]!r} on the cell's PATH ({os.environ.get('PATH', '')})")
            return None
        return super().shebang(line, cell)


# The rest of IPython's script magics (%killbgscripts), beside the %%script above.
CellScriptMagics.magics = {
    kind: {**ScriptMagics.magics[kind], **CellScriptMagics.magics[kind]} for kind in ScriptMagics.magics
}


def make_shell(channel: Sender, user_ns: dict[str, Any]) -> CellShell:
    """The cell's shell, sending to ``channel``, running in ``user_ns``; history stays in memory."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.display_page = False
    # "IPKernelApp" in get_ipython().config tells libraries (tqdm, pygmt, ...) that ipykernel's application
    # started the shell; under Jupyter ipykernel's holds the connection file's path, here only its name.
    config.IPKernelApp.connection_file = ""
    shell = CellShell.instance(config=config, user_ns=user_ns, channel=channel)
    shell.kernel = CellKernel(shell)
    # IPython's default extension (InteractiveShellApp.default_extensions), which ipykernel's app loads: %store.
    assert shell.extension_manager is not None
    shell.extension_manager.load_extension("storemagic")
    return shell
