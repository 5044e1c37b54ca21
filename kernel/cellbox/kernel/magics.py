"""cellbox's own magics, and the reading of a cell's ``%%limits`` line.

The kernel reads a first line ``%%limits wall=5 cpu=2 memory=256M output=100K``
itself (:func:`split_limits_line`), before any child starts, so a bad line
stops the cell with a one-line error.  Inside the child, :func:`register` adds
``%limits`` / ``%%limits`` to IPython beside its own magics (so ``%limits?``
shows the help below) and replaces the magics that need a long-lived process
with one clear sentence each.
"""

from __future__ import annotations

from typing import Any

from ..sandbox.limits import LimitError, Limits

__all__ = ["split_limits_line", "register", "LIMITS_HELP", "NEEDS_LONG_LIVED_PROCESS"]

LIMITS_HELP = """Set this cell's limits, or show them.

On the first line of a cell::

    %%limits wall=5 cpu=2 memory=256M output=100K

runs that cell (only) with these limits; the session's limits hold for the
other cells.  Names: wall (wall_time, seconds), cpu (cpu_time, CPU seconds,
RLIMIT_CPU), memory (address space, RLIMIT_AS; "none" for no limit), output
(bytes of stdout+stderr), file_size, open_files, processes, nice, io_class.
Times accept 5, 2.5s, 1m; sizes accept 256M, 1.5G, 64K.

``%limits`` on its own prints the limits this cell runs with.  Session limits
come from the kernel's configuration (``--CellboxKernel.wall_time=30`` in the
kernelspec, or ``cellbox install --wall 30``).
"""

# Magic name -> why it cannot work when every cell is a new process.
NEEDS_LONG_LIVED_PROCESS = {
    "qtconsole": "%qtconsole connects to a long-lived kernel process, and cellbox has none per session",
    "connect_info": "%connect_info describes a long-lived kernel process, and cellbox runs each cell in a new one",
    "subshell": "%subshell lists the threads of a long-lived kernel process that run cells side by side, and "
    "cellbox runs each cell in a new process, one at a time",
}


def split_limits_line(code: str) -> tuple[dict[str, str] | None, str]:
    """Split a leading ``%%limits`` line off ``code``.

    Returns:
        ``(values, body)``: ``values`` maps the names on the line to their text
        (``{"wall": "5"}``), or is ``None`` when the cell has no such line; ``body``
        is the rest of the cell (the whole cell when there was no line).

    Raises:
        LimitError: a word on the line is not ``name=value``.
    """
    first, newline, rest = code.lstrip("\n").partition("\n")
    words = first.split()
    if not words or words[0] != "%%limits":
        if not first.startswith("%%") and any(line.split()[:1] == ["%%limits"] for line in rest.splitlines()):
            raise LimitError("%%limits works on the first line of a cell only; move it there", source="%%limits line")
        return None, code
    values: dict[str, str] = {}
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if not sep or not name or not value:
            raise LimitError(
                f"{word!r} is not name=value; write for example %%limits wall=5 cpu=2 memory=256M",
                source="%%limits line",
            )
        if name in values:
            raise LimitError(f"{name} is given twice; keep one {name}=...", source="%%limits line")
        values[name] = value
    return values, rest


def cell_limits(code: str, base: Limits) -> tuple[Limits, str]:
    """The limits a cell runs with and the code left to run, from its ``%%limits`` line.

    Raises:
        LimitError: the line is malformed or names an unknown limit or a bad value.
    """
    values, body = split_limits_line(code)
    if values is None:
        return base, code
    return base.updated(values, source="%%limits line"), body


def register(shell: Any, limits: dict[str, Any]) -> None:
    """Add cellbox's magics to ``shell`` (an IPython InteractiveShell in a cell's child), or update them.

    The session's shell lives on from cell to cell (each cell is forked from
    the last one's snapshot), so the magics are made once, when a shell first
    gets them (about a millisecond: a traitlets class), and later cells only
    set the limits ``%limits`` shows.

    Args:
        shell: the child's shell.
        limits: the limits this cell runs with (``Limits.as_dict()``), shown by ``%limits``.
    """
    shell.cellbox_limits = dict(limits)
    if getattr(shell, "cellbox_magics", False):
        return
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class CellboxMagics(Magics):
        @line_cell_magic
        def limits(self, line: str = "", cell: str | None = None) -> None:
            if cell is not None or line.strip():
                raise UsageError(
                    "%%limits works on the first line of a cell only, where cellbox reads it before the cell "
                    "starts; move it there"
                )
            now = getattr(self.shell, "cellbox_limits", {})
            print(Limits(**now).describe() if now else Limits().describe())

    CellboxMagics.limits.__doc__ = LIMITS_HELP
    shell.register_magics(CellboxMagics)
    for name, reason in NEEDS_LONG_LIVED_PROCESS.items():
        _replace_magic(shell, name, reason)
    shell.cellbox_magics = True


def _replace_magic(shell: Any, name: str, reason: str) -> None:
    from IPython.core.error import UsageError

    def refuse(line: str = "", cell: str | None = None) -> None:
        raise UsageError(reason)

    refuse.__doc__ = f"Not available under cellbox: {reason}."
    shell.register_magic_function(refuse, "line", name)
