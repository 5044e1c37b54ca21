"""The course a notebook belongs to: the folder tree its cells may read, above the notebook folder.

Course repositories keep data beside the notebooks' folder (``course/data.csv``,
``course/assets/``, ``course/lesson/intro.ipynb``), and a notebook reads
``../data.csv``.  The kernel's session shows that tree read-only, the notebook
folder read-write on top of it (see :mod:`cellbox.sandbox.isolation`).

The tree's top, the **course root**, is either set by an administrator (the
kernel setting ``course_root``) or found: the nearest folder, from the notebook
folder up, that holds a repository (``.git``, ``.hg``) or else a project file
(``pyproject.toml``, ``requirements.txt``, ``environment.yml``...), the markers
Binder's repo2docker and the packaging tools read.  The search never goes up to
or past a folder that is refused as a course root, and finding nothing leaves the
notebook folder alone readable, as before.  Nor does it go up to an nbgrader
course directory (``nbgrader_config.py``, ``gradebook.db``): a submission that
``nbgrader autograde`` runs in ``autograded/STUDENT/ASSIGNMENT/`` must not read the
other students' work.

Refused as a course root (:func:`check_course_root`): ``/``; a home directory or
a folder holding one (this user's, ``/root``, and the homes of login users,
uid >= 1000, as login.defs(5) ``UID_MIN`` has it on Debian); the machine's shared
temporary folders (``/tmp``, ``/var/tmp``, ``/dev/shm``), where other sessions'
task directories lie, or a folder holding one.  A folder *inside* a home is fine:
that is where a student clones a course.  Stdlib only, part of the sandbox core.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterable

from .isolation import home_directories

__all__ = [
    "CourseRootError",
    "REPOSITORY_MARKERS",
    "PROJECT_MARKERS",
    "GRADING_MARKERS",
    "find_course_root",
    "check_course_root",
]

# A folder holding one of these is a repository's top: the strongest sign of where a course begins.
REPOSITORY_MARKERS = (".git", ".hg")
# Files a project keeps at its top (repo2docker's configuration files, PEP 518's pyproject.toml).
PROJECT_MARKERS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "environment.yml",
    "environment.yaml",
    "Pipfile",
)
# An nbgrader course directory: its tree holds every student's submission and the gradebook, so a notebook
# below it (autograded/STUDENT/ASSIGNMENT/) is never given that tree by the search.
GRADING_MARKERS = ("nbgrader_config.py", "gradebook.db")
# Folders every user of the machine shares, with other sessions' task directories in them.
SHARED_TEMPORARY = ("/tmp", "/var/tmp", "/dev/shm")
# Login users' uids start here (login.defs(5) UID_MIN on Debian); 65534 is nobody, whose home is no one's.
UID_MIN = 1000
NOBODY = 65534


class CourseRootError(ValueError):
    """A course root that cannot be shown to cells (``/``, a home, a shared temporary folder, a relative path)."""


def _within(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip(os.sep) + os.sep)


def refused_folders() -> list[str]:
    """Folders a course root may be neither equal to nor above: homes and shared temporary folders (real paths)."""
    homes = list(home_directories())
    for entry in pwd.getpwall():
        if entry.pw_uid >= UID_MIN and entry.pw_uid != NOBODY and entry.pw_dir not in ("", "/"):
            homes.append(entry.pw_dir)
    shared = [*SHARED_TEMPORARY, tempfile.gettempdir()]
    return list(dict.fromkeys(os.path.realpath(p) for p in [*homes, *shared]))


def _refusal(path: str, refused: Iterable[str]) -> str | None:
    """Why ``path`` (a real, absolute path) cannot be a course root, or ``None``."""
    if path == os.sep:
        return "it is / (the whole machine)"
    for folder in refused:
        if _within(folder, path):
            what = "a shared temporary folder" if folder in (*SHARED_TEMPORARY, tempfile.gettempdir()) else "a home"
            return f"it is or holds {what} ({folder})"
    return None


def check_course_root(path: str, *, source: str = "course_root") -> str:
    """The real path of ``path``, checked as a course root.

    Args:
        path: an absolute folder path.
        source: where the value came from, for the message (``"CellboxKernel.course_root"``).

    Raises:
        CourseRootError: ``path`` is relative, not a folder, ``/``, a home or a folder above one, or a shared
            temporary folder or a folder above one; the message says what to give instead.
    """
    if not os.path.isabs(path):
        raise CourseRootError(f"{source}: {path!r} is not an absolute path; give the course folder's full path")
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise CourseRootError(f"{source}: {path!r} is not a folder; give the folder that holds the course")
    reason = _refusal(real, refused_folders())
    if reason is not None:
        raise CourseRootError(
            f"{source}: {path!r} cannot be a course root: {reason}, which cells must not see; give the course's own "
            "folder"
        )
    return real


def find_course_root(notebook_dir: str) -> str:
    """The course root of a notebook folder: the nearest repository top, else the nearest project top, else itself.

    The search goes from ``notebook_dir`` (a real, absolute path) upward and stops
    below the first folder :func:`check_course_root` would refuse (a home, ``/``...),
    so a ``.git`` in the user's home never makes the whole home readable, and below
    an nbgrader course directory (:data:`GRADING_MARKERS`), whose tree holds every
    student's submission.

    Returns:
        The real path of the course root (``notebook_dir`` itself when nothing is found).
    """
    start = os.path.realpath(notebook_dir)
    refused = refused_folders()
    candidates = []
    folder = start
    while _refusal(folder, refused) is None and not _holds(folder, GRADING_MARKERS):
        candidates.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for markers in (REPOSITORY_MARKERS, PROJECT_MARKERS):
        for candidate in candidates:
            if _holds(candidate, markers):
                return candidate
    return start


def _holds(folder: str, names: Iterable[str]) -> bool:
    return any(os.path.lexists(os.path.join(folder, name)) for name in names)
