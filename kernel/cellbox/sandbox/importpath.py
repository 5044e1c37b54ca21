"""A trusted process's import path: no folder that a cell, a program or a submission can write.

Python puts the working directory (``python -m``, ``-c``) or the script's
folder first on ``sys.path``, and an empty or relative entry of
``PYTHONPATH`` means the working directory too (sys.path, "The initialization
of the sys.module search path").  A kernel starts in the notebook's folder,
which its cells write, so a ``jedi.py`` or a ``cellbox/__init__.py`` left
there would be imported by the kernel, by the session's keeper, or by the next
kernel started in that folder.  The interpreter's own flags close most of it
before the first import: ``-P`` (new in 3.11: nothing
prepended), ``-E`` (no ``PYTHON*`` variables, so no ``PYTHONPATH``) and ``-s``
(no user site-packages, with its ``.pth`` files and ``usercustomize``).
:func:`trusted_sys_path` is the second wall, for whatever a process imports
later (lazily) when it was started without them: an old kernelspec, a
``python -m cellbox.kernel`` typed by hand.

Standard library only: the session's keeper calls it before its preload.
"""

import os
import sys

__all__ = ["KERNEL_FLAGS", "KEEPER_FLAGS", "trusted_sys_path", "add_working_directory"]

# The interpreter flags of the kernel (kernel.json): -P (no working directory on sys.path) and -E (no
# PYTHONPATH and the like from the environment of whoever started Jupyter).  Not -s: cellbox may be
# installed in the user's site-packages (pip install --user), which is outside every folder cells write.
KERNEL_FLAGS = ("-E", "-P")
# The session's keeper (and so every snapshot and forked run): -P, and -s because its HOME is the
# task's home/, which cells write (a .pth there would run in the next keeper).  Not -E: its environment
# is cellbox's own allowlist, whose PYTHONUNBUFFERED and PYTHONDONTWRITEBYTECODE the cells keep.
KEEPER_FLAGS = ("-s", "-P")
# The folders of installed packages, which IPython puts a cell's working directory before.
SITE_FOLDERS = ("site-packages", "dist-packages")


def _resolved(entry: str) -> str:
    return os.path.realpath(entry or os.curdir)


def trusted_sys_path(writable: tuple[str, ...] = (), path: list[str] | None = None) -> list[str]:
    """Remove from ``path`` (default ``sys.path``, in place) every entry a cell may write; return those removed.

    Removed: the empty entry and every relative one (both are looked up from
    the working directory at import time), the working directory itself, and
    each folder of ``writable`` (the notebook folder, the task directory),
    compared by real path.  Folders below them are kept: an editable install
    of cellbox in a project the kernel was started in lives there.

    Args:
        writable: absolute folders cells or programs can write.
        path: the list to clean; ``sys.path`` by default.

    Returns:
        The removed entries, in their order (for a note or a test).
    """
    entries = sys.path if path is None else path
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed: relative entries name nothing
        here = None
    banned = {os.path.realpath(folder) for folder in writable}
    if here is not None:
        banned.add(here)
    removed = [entry for entry in entries if not os.path.isabs(entry) or _resolved(entry) in banned]
    entries[:] = [entry for entry in entries if entry not in removed]
    return removed


def add_working_directory(path: list[str] | None = None) -> bool:
    """Put ``''`` (the working directory, looked up at import time) on ``path`` as ipykernel's cells have it.

    Only in a cell's own, untrusted process: IPython's
    ``InteractiveShellApp.init_path`` inserts it before the first
    ``site-packages`` (or ``dist-packages``) folder, after the standard
    library, so a cell can ``import mymodule`` from the notebook folder but a
    ``json.py`` there does not replace the standard library's.  Nothing is
    done when the entry is there already.

    Returns:
        ``True`` when the entry was added.
    """
    entries = sys.path if path is None else path
    if "" in entries:
        return False
    sites = [n for n, entry in enumerate(entries) if os.path.basename(entry.rstrip(os.sep)) in SITE_FOLDERS]
    entries.insert(sites[0] if sites else 0, "")
    return True
