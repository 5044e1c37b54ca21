"""Find submissions in a folder and lay each one out in its task directory.

A submission is one entry of the submissions folder (names starting with ``.``
or ``__`` are ignored); its id is the entry's name without the suffix
(``alice.zip`` -> ``alice``), or the whole name when two entries would share
an id.  Four forms:

* **a folder**: a package (``pyproject.toml`` or ``setup.py`` at its top, installed
  with pip into the task's virtualenv) or loose modules (importable as they
  are), with an optional ``requirements.txt`` (installed with pip);
* **a .zip** of such a folder (a single top-level folder in it is stepped
  into).  Members with absolute paths or ``..``, symbolic links, more than
  :data:`ZIP_MAX_MEMBERS` members, more than :data:`ZIP_MAX_BYTES` unpacked,
  or a member that unpacks past :data:`ZIP_MAX_RATIO` times its packed size
  reject the submission with a one-line reason;
* **a single .py file**: importable as ``submission`` and under its own name;
* **a notebook .ipynb**: its code cells become a module (see below).

Notebooks (and every top-level ``*.ipynb`` of a folder) are converted by the
grader, which only reads their JSON: code cells are joined in order into
``<notebook>.ipynb.py``, run by the module ``<name>.py`` once, in a module named
``__main__`` as under a kernel (work under ``if __name__ == "__main__":`` runs;
importing the module again, or as ``submission``, does not run it again),
where ``<name>`` is the notebook's file name without ``.ipynb``, every
character other than a letter, digit or ``_`` replaced by ``_``, and ``nb_`` put in front when it starts with a digit
(``01-subprocess.ipynb`` -> ``nb_01_subprocess``).  A notebook submission, or a
folder with exactly one notebook and no ``submission.py``, is also importable
as ``submission`` (the same module object).  Left out: cells tagged
``raises-exception`` or ``skip-grading``, cells that start with a cell magic
(``%%``), and lines that are IPython magics (``%time x``), shell escapes
(``!pip install``), captures (``files = !ls``) or help (``len?``).

Symbolic links and special files in a submission folder are not copied: a
link could point at the instructor's tests or anywhere else on the machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

__all__ = [
    "Submission",
    "Layout",
    "SubmissionError",
    "discover",
    "lay_out",
    "module_name",
    "notebook_source",
    "ZIP_MAX_BYTES",
    "ZIP_MAX_MEMBERS",
    "ZIP_MAX_RATIO",
]

ZIP_MAX_BYTES = 200 * 1024**2
ZIP_MAX_MEMBERS = 10_000
ZIP_MAX_RATIO = 200
SKIP_TAGS = frozenset({"raises-exception", "skip-grading"})
KINDS = ("folder", "zip", "py", "ipynb")
_MAGIC_LINE = re.compile(r"^\s*(?:[%!]|[\w.,\s]+=\s*[%!])")
_HELP_LINE = re.compile(r"^\s*\??[\w.]+\?\??\s*$")


class SubmissionError(ValueError):
    """A submission cannot be graded as given (an unsafe zip, an unreadable notebook).

    The message is one line; it becomes the reason of that submission's ``unverified`` row.
    """


@dataclasses.dataclass(frozen=True)
class Submission:
    """One entry of the submissions folder.

    Attributes:
        id: the name used in every report (``alice``).
        path: absolute path of the entry.
        kind: ``folder``, ``zip``, ``py`` or ``ipynb``.
    """

    id: str
    path: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Layout:
    """A submission laid out in its task directory.

    Attributes:
        root: the folder that holds its files (the tests' working directory, and on ``sys.path``).
        package: ``True`` when it has ``pyproject.toml`` or ``setup.py`` (pip installs it).
        requirements: ``True`` when it has ``requirements.txt`` (pip installs those).
        modules: module names made from notebooks or a single file.
    """

    root: Path
    package: bool
    requirements: bool
    modules: tuple[str, ...] = ()


def _kind(path: Path) -> str | None:
    if path.is_symlink():
        return None
    if path.is_dir():
        return "folder"
    suffix = path.suffix.lower()
    if path.is_file() and suffix in (".zip", ".py", ".ipynb"):
        return suffix[1:]
    return None


def discover(folder: str | os.PathLike[str]) -> list[Submission]:
    """List the submissions in ``folder``, sorted by id.

    Raises:
        SubmissionError: ``folder`` is not a readable folder, or holds no submission.
    """
    base = Path(folder)
    if not base.is_dir():
        raise SubmissionError(f"{folder}: not a folder; give the folder that holds the submissions")
    try:
        entries = sorted(base.iterdir())
    except OSError as exc:
        raise SubmissionError(f"{folder}: cannot be read ({exc.strerror})") from None
    found = [
        (entry, kind)
        for entry in entries
        if not entry.name.startswith((".", "__")) and (kind := _kind(entry)) is not None
    ]
    if not found:
        raise SubmissionError(f"{folder}: no submissions found (folders, .zip, .py or .ipynb files)")
    stems = [entry.stem if kind != "folder" else entry.name for entry, kind in found]
    result = []
    for (entry, kind), stem in zip(found, stems, strict=True):
        ident = stem if stems.count(stem) == 1 else entry.name
        result.append(Submission(id=ident, path=str(entry.resolve()), kind=kind))
    return sorted(result, key=lambda item: item.id)


REQUIREMENTS_MAX = 256 * 1024  # characters of a requirements.txt read


def module_name(filename: str) -> str:
    """The module name of a notebook or file: ``01-subprocess.ipynb`` -> ``nb_01_subprocess``."""
    stem = filename.rsplit(".", 1)[0] if "." in filename else filename
    name = re.sub(r"\W", "_", stem, flags=re.ASCII) or "notebook"
    return f"nb_{name}" if name[0].isdigit() else name


def _code_lines(source: str) -> list[str]:
    if source.lstrip().startswith("%%"):
        return []
    return [line for line in source.splitlines() if not _MAGIC_LINE.match(line) and not _HELP_LINE.match(line)]


def notebook_source(data: bytes, name: str = "notebook") -> str:
    """The Python module made from a notebook's code cells (rules in the module docstring).

    Raises:
        SubmissionError: the file is not a notebook (not JSON, or no ``cells`` list).
    """
    try:
        notebook = json.loads(data)
        cells = notebook["cells"]
        if not isinstance(cells, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise SubmissionError(f"{name}: not a readable notebook (expected nbformat 4 JSON with cells)") from None
    parts = [f"# Made by cellbox grade from the code cells of {name}.\n"]
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        tags = (cell.get("metadata") or {}).get("tags") or []
        if SKIP_TAGS.intersection(tags):
            continue
        source = cell.get("source") or ""
        text = "".join(source) if isinstance(source, list) else str(source)
        lines = _code_lines(text)
        if any(line.strip() for line in lines):
            parts.append(f"# cell {number}\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


def _copy_tree(source: Path, dest: Path) -> None:
    """Copy regular files and folders only: links and devices are left behind."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(source):
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), dest / entry.name)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, dest / entry.name)


def _zip_members(archive: zipfile.ZipFile, name: str) -> list[zipfile.ZipInfo]:
    members = archive.infolist()
    if len(members) > ZIP_MAX_MEMBERS:
        raise SubmissionError(f"{name}: more than {ZIP_MAX_MEMBERS} members; is it a zip bomb?")
    total = 0
    for info in members:
        path = PurePosixPath(info.filename.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or ":" in info.filename:
            raise SubmissionError(f"{name}: member {info.filename!r} would unpack outside its folder")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise SubmissionError(f"{name}: member {info.filename!r} is a symbolic link; links are not accepted")
        total += info.file_size
    if total > ZIP_MAX_BYTES:
        raise SubmissionError(f"{name}: unpacks to more than {ZIP_MAX_BYTES // 1024**2} MB; is it a zip bomb?")
    return members


def _extract_zip(path: Path, dest: Path) -> None:
    """Unpack a zip safely, counting real bytes (the sizes in the directory can lie)."""
    name = path.name
    try:
        with zipfile.ZipFile(path) as archive:
            written = 0
            for info in _zip_members(archive, name):
                if info.filename.startswith("__MACOSX/"):
                    continue
                target = dest.joinpath(*PurePosixPath(info.filename.replace("\\", "/")).parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                limit = max(info.compress_size, 1) * ZIP_MAX_RATIO + 1024**2
                with archive.open(info) as member, open(target, "wb") as out:
                    size = 0
                    while chunk := member.read(1024**2):
                        size += len(chunk)
                        written += len(chunk)
                        if size > limit or written > ZIP_MAX_BYTES:
                            raise SubmissionError(f"{name}: {info.filename!r} unpacks too far; is it a zip bomb?")
                        out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise SubmissionError(f"{name}: not a readable zip file ({exc})") from None


def _unpack_zip(path: Path, dest: Path) -> None:
    """Unpack into ``dest`` (not yet existing); a single top-level folder is stepped into."""
    staging = dest.with_name(dest.name + ".unpacked")
    staging.mkdir()
    try:
        _extract_zip(path, staging)
        entries = [entry for entry in staging.iterdir() if entry.name != "__MACOSX"]
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() else staging
        top.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _alias(root: Path, module: str) -> None:
    """Make ``submission`` the same module object as ``module``."""
    if module == "submission" or (root / "submission.py").exists():
        return
    (root / "submission.py").write_text(
        f"# Made by cellbox grade: this submission's code is importable as 'submission'.\n"
        f"import sys\nimport {module}\nsys.modules[__name__] = {module}\n"
    )


# The module of a notebook: runs its cells (in CELLS, beside it) once, in a module named "__main__", as a
# kernel runs them; importing it again, or as `submission`, gives the same module.
NOTEBOOK_LOADER = """\
# Made by cellbox grade: the code cells of {notebook} (in {cells}), run once as a kernel runs them.
import sys as _sys
import types as _types

_main = _types.ModuleType("__main__")
_main.__file__ = __file__.rpartition("/")[0] + "/" + {cells!r}
_main.__spec__ = __spec__  # the importable name stays this module's
_sys.modules["__main__"] = _main
_sys.modules[__name__] = _main
with open(_main.__file__, encoding="utf-8") as _cells:
    _code = compile(_cells.read(), _main.__file__, "exec")
exec(_code, _main.__dict__)
"""


def _convert_notebooks(root: Path) -> tuple[str, ...]:
    """Write each top-level notebook's cells as ``NAME.ipynb.py`` and its module ``MODULE.py`` (the loader)."""
    modules = []
    for notebook in sorted(root.glob("*.ipynb")):
        name = module_name(notebook.name)
        cells = f"{notebook.name}.py"
        (root / cells).write_text(notebook_source(notebook.read_bytes(), notebook.name))
        (root / f"{name}.py").write_text(NOTEBOOK_LOADER.format(notebook=notebook.name, cells=cells))
        modules.append(name)
    if len(modules) == 1:
        _alias(root, modules[0])
    return tuple(modules)


def lay_out(submission: Submission, dest: Path) -> Layout:
    """Copy (or unpack, or convert) ``submission`` into the new folder ``dest``.

    Raises:
        SubmissionError: an unsafe or unreadable zip, an unreadable notebook, an
            empty folder.
    """
    source = Path(submission.path)
    try:
        if submission.kind == "zip":
            _unpack_zip(source, dest)
        else:
            dest.mkdir(parents=True)
        if submission.kind == "folder":
            _copy_tree(source, dest)
        elif submission.kind == "py":
            name = module_name(source.name)
            shutil.copyfile(source, dest / f"{name}.py")
            _alias(dest, name)
        else:
            shutil.copyfile(source, dest / source.name)
    except OSError as exc:
        raise SubmissionError(f"{source.name}: cannot be read ({exc.strerror or exc})") from None
    modules = _convert_notebooks(dest)
    if submission.kind == "py":
        modules = (module_name(source.name),)
    if not any(dest.iterdir()):
        raise SubmissionError(f"{source.name}: the submission is empty")
    package = (dest / "pyproject.toml").is_file() or (dest / "setup.py").is_file()
    return Layout(root=dest, package=package, requirements=(dest / "requirements.txt").is_file(), modules=modules)


def requirement_names(layout: Layout) -> tuple[str, ...]:
    """The requirements of ``requirements.txt`` as written (one per line, comments and options left out).

    Read as data, never executed; names only matter here (:func:`cellbox.grading.imports.own_modules`).
    """
    path = layout.root / "requirements.txt"
    if not layout.requirements:
        return ()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:REQUIREMENTS_MAX]
    except OSError:
        return ()
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("-"))
