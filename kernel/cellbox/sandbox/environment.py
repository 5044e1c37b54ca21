"""The child's environment, built from an allowlist (design rule 2), and task directories.

Nothing is copied from the parent's environment unless it is named here or by
the caller: a secret in the kernel's environment (its connection file, a token,
``JPY_*``) never reaches a child, whatever it is called.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["TaskDirectory", "build_environment", "strip_setid_bits", "PASSED_THROUGH", "FIXED"]

# Names copied from the parent only when set there: locale and terminal, which
# change how text is printed, never what a program may reach.
PASSED_THROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")

# Names every child gets.  The thread counts keep BLAS pools from reserving
# address space per core, which a tight RLIMIT_AS turns into a failed import;
# MALLOC_ARENA_MAX keeps glibc's malloc from reserving a 64 MiB arena for each
# thread (mallopt(3), M_ARENA_MAX), so 64 threads fit under 256M.
FIXED = {
    "MALLOC_ARENA_MAX": "2",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclasses.dataclass
class TaskDirectory:
    """A throwaway directory per run or kernel session, with ``home/``, ``work/`` and ``tmp/``.

    Make one with :meth:`create`; use it as a context manager, or call
    :meth:`remove`.  Removal first makes every directory writable again, so a
    child cannot keep its files by taking its own permissions away.
    """

    path: Path
    home: Path
    work: Path
    tmp: Path

    @classmethod
    def create(cls, base: str | os.PathLike[str] | None = None, prefix: str = "cellbox-") -> TaskDirectory:
        """Make a new, empty task directory (mode 0o700) under ``base`` and return it.

        Args:
            base: parent directory (default: the system temp dir).
            prefix: name prefix, so a left-over directory is recognisable.
        """
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        parts = {name: path / name for name in ("home", "work", "tmp")}
        for part in parts.values():
            part.mkdir(mode=0o700)
        return cls(path=path, **parts)

    def open_to(self, uid: int, gid: int) -> None:
        """Give the task directory to another user, for children that run as that user."""
        for entry in (self.path, self.home, self.work, self.tmp):
            os.chown(entry, uid, gid)

    def remove(self) -> None:
        """Delete the task directory and everything in it (idempotent).

        A run may have left folders it closed to its owner (mode 0): each is
        opened up first.  Nothing it left is followed: a folder is changed
        only through a descriptor opened with ``O_NOFOLLOW`` (open(2)), so a
        symlink the run put in place of one never makes this process change
        a folder outside the task, and :func:`shutil.rmtree` unlinks links
        without following them.
        """
        if not self.path.exists():
            return
        open_up(self.path)
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> TaskDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def open_up(root: str | os.PathLike[str]) -> None:
    """Give the owner ``rwx`` on every folder below ``root``, without following a symlink anywhere.

    Walks with :func:`os.fwalk` (which does not follow links) and changes each
    folder through a descriptor opened with ``O_PATH | O_NOFOLLOW |
    O_DIRECTORY`` relative to its parent's descriptor (``O_PATH`` needs no
    permission on a folder its owner closed), by its ``/proc/self/fd`` name
    (open(2), proc(5)): a link, or a folder swapped for a link meanwhile, fails
    to open and is left alone.
    """
    for _folder, dirs, _files, parent in os.fwalk(root):
        for name in dirs:
            try:
                fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            except OSError:
                continue  # a symlink, or gone
            try:
                os.chmod(f"/proc/self/fd/{fd}", 0o700)
            except OSError:
                pass  # not ours to change
            finally:
                os.close(fd)


def build_environment(
    task: TaskDirectory,
    *,
    extra: Mapping[str, str] | None = None,
    interpreter: str | None = None,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a child's environment from nothing but the allowlist.

    Args:
        task: the run's task directory; ``HOME`` and ``TMPDIR`` point inside it.
        extra: names the caller adds on purpose (they win over the defaults).
        interpreter: the Python whose ``bin`` directory leads ``PATH``
            (default: ``sys.executable``).
        parent: the environment to take :data:`PASSED_THROUGH` names from
            (default: ``os.environ``).

    Returns:
        A new dict; the parent's environment is not changed.
    """
    parent = os.environ if parent is None else parent
    bindir = os.path.dirname(os.path.abspath(interpreter or sys.executable))
    env = {name: parent[name] for name in PASSED_THROUGH if name in parent}
    env.update(FIXED)
    env.update(
        PATH=os.pathsep.join(dict.fromkeys([bindir, "/usr/local/bin", "/usr/bin", "/bin"])),
        HOME=str(task.home),
        TMPDIR=str(task.tmp),
    )
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


# Entries strip_setid_bits looks at, at most: it runs after every run on a machine without a syscall filter.
SETID_SWEEP_LIMIT = 100_000


def strip_setid_bits(folders: list[str], limit: int = SETID_SWEEP_LIMIT) -> list[str]:
    """Remove S_ISUID and S_ISGID from every file and directory below ``folders``; the paths changed.

    The last wall against a set-user-ID file a root run left, where no syscall
    filter can refuse making it (see docs/isolation.md): called after the run.
    A kernel session's snapshots outlive the run and may still be woken (a
    timer's SIGCONT, until the keeper sees it), so nothing is taken by name:
    the walk holds each folder by a descriptor (:func:`os.fwalk`, which never
    follows a link nor a folder swapped for one), and each entry is opened
    with ``O_PATH | O_NOFOLLOW`` and changed through that descriptor's
    ``/proc/self/fd`` name (open(2), proc(5)), so a link put in its place is
    never followed to a file outside.  At most ``limit`` entries are looked
    at, in all.  Errors on single entries are skipped (the caller's note names
    what was changed).
    """
    changed: list[str] = []
    seen = 0
    for folder in dict.fromkeys(folders):
        for directory, dirs, files, folder_fd in os.fwalk(folder):
            for name in [*dirs, *files]:
                seen += 1
                if seen > limit:
                    return changed
                try:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=folder_fd)
                except OSError:
                    continue
                try:
                    info = os.fstat(fd)
                    if info.st_mode & 0o6000 and not stat.S_ISLNK(info.st_mode):
                        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(info.st_mode) & 0o1777)
                        changed.append(os.path.join(directory, name))
                except OSError:
                    continue
                finally:
                    os.close(fd)
    return changed
