"""Virtualenvs for grading: one base library per grading run, one fresh venv per submission.

Speed without sharing.  Installing pytest from an index into every task's
virtualenv would dominate the time of a small submission, and a writable
directory shared between tasks could be changed by one submission to fool the
next (children may run as root, who can write anywhere they can see).  So:

* :class:`BaseLibrary` is built once per grading run, in a directory of the
  grader's: the files of pytest and its dependencies (pluggy, iniconfig,
  packaging, pygments) copied from the grader's own installation, listed by
  their ``RECORD`` (``importlib.metadata``, PEP 376/627), byte-compiled once,
  plus the grader's reporter plugin.  No network is needed.
* each task gets a new virtualenv made with :mod:`venv` without pip
  (``python -m venv --without-pip``: a ``pyvenv.cfg`` and a symlink, a few
  milliseconds).  Its test run puts the base library first on ``sys.path``:
  the grading run's one library itself when the run is another user, to whom
  the library is 0644 files in 0755 folders, else, *after* the submission's
  install, the task's own **copy** (about 0.2 s).  A submission that installs
  its own ``pytest`` or a module named like the reporter does not change what
  runs the tests.

Installs run the grader's pip against the task's interpreter
(``pip --python VENV_PYTHON``, pip >= 22.3) inside the sandbox, with the
submission's limits and scrubbed environment (build backends are code).
Build isolation stays on: pip builds the package in a fresh environment with
the backend the package declares, fetched from the package index (or from
``--find-links`` given to ``cellbox grade``).  Without network access a
package or a ``requirements.txt`` cannot be installed; that submission is
``unverified`` with pip's last line as the reason.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import venv
from pathlib import Path

__all__ = [
    "BaseLibrary",
    "SetupError",
    "BASE_DISTRIBUTIONS",
    "REPORTER_MODULE",
    "create_venv",
    "pip_install_command",
    "readable_by_all",
]

BASE_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
REPORTER_MODULE = "cellbox_grading_reporter"


class SetupError(RuntimeError):
    """The grader cannot prepare its own files (pytest missing beside it); one line, for the command line."""


class BaseLibrary:
    """pytest, its dependencies and the reporter, built once per grading run.

    Use :meth:`build` (or as a context manager); :meth:`copy_to` gives a task its
    own copy; :meth:`remove` deletes it.  Safe to share between threads: it
    is only read after :meth:`build`.

    Attributes:
        path: the directory holding the modules (put first on ``sys.path``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def build(cls, parent: str | os.PathLike[str] | None = None) -> BaseLibrary:
        """Copy the base distributions and the reporter into a new directory.

        Raises:
            SetupError: a base distribution is not installed beside the grader.
        """
        root = Path(tempfile.mkdtemp(prefix="cellbox-base-", dir=parent))
        library = root / "lib"
        try:
            for name in BASE_DISTRIBUTIONS:
                _copy_distribution(name, library)
            shutil.copyfile(Path(__file__).with_name("reporter.py"), library / f"{REPORTER_MODULE}.py")
            _trim_pygments(library)
            # Compiled once here; copies keep the mtimes (copy2), so the .pyc stay valid
            # in the task even though its children never write bytecode.
            compileall.compile_dir(library, quiet=2, workers=1)
            readable_by_all(root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(library)

    def shared(self) -> Path:
        """The library itself, for a run that cannot write it.

        Raises:
            FileNotFoundError: the library was removed (as copying it would).
        """
        if not (self.path / f"{REPORTER_MODULE}.py").is_file():
            raise FileNotFoundError(f"the base library {self.path} is gone")
        return self.path

    def copy_to(self, dest: Path) -> Path:
        """Copy the library to ``dest`` (a new directory) and return it."""
        shutil.copytree(self.path, dest, copy_function=shutil.copy2)
        return dest

    def remove(self) -> None:
        """Delete the base library (idempotent)."""
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def __enter__(self) -> BaseLibrary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def readable_by_all(root: Path) -> None:
    """Folders 0755 and files 0644 below ``root``: every user may read the library, only its owner write it."""
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    os.chmod(root, 0o755)


def _copy_distribution(name: str, library: Path) -> None:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise SetupError(f"{name} is not installed beside cellbox; install it with pip (pip install {name})") from None
    for item in dist.files or ():
        parts = Path(str(item)).parts
        if not parts or parts[0] == ".." or parts[0].endswith(".dist-info") or parts[0] == "__pycache__":
            continue  # scripts outside site-packages, metadata, top-level caches
        source = Path(str(item.locate()))
        if not source.is_file():
            continue
        target = library.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


# A pytest session over passing, failing, erroring and skipped tests, run once
# by the grader (trusted code, no submission) to see which pygments modules
# pytest really imports with --color=no; the rest of pygments (its hundreds of
# lexers and styles) is not copied into every task.
_TRACE = """
import json, os, sys, tempfile
library = sys.argv.pop(1)
sys.path.insert(0, library)
import pytest
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "test_trace.py"), "w") as f:
    f.write("import pytest\\n@pytest.fixture\\ndef broken():\\n    raise ValueError\\n"
            "def test_pass():\\n    pass\\ndef test_fail():\\n    assert [1, 2] == [1, 3]\\n"
            "def test_error(broken):\\n    pass\\ndef test_skip():\\n    pytest.skip('x')\\n"
            "@pytest.mark.xfail\\ndef test_xfail():\\n    assert 0\\n")
pytest.main(["-q", "-p", "no:cacheprovider", "--color=no", "--code-highlight=no", "--tb=short", "-rA", folder])
print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values())
                         if getattr(m, "__file__", None) and m.__file__.startswith(library)})))
"""


def _trim_pygments(library: Path) -> None:
    """Delete the pygments modules a pytest session does not import (see ``_TRACE``)."""
    from ..sandbox import run

    done = run([sys.executable, "-I", "-B", "-c", _TRACE, str(library)], env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    try:
        used = {Path(name) for name in json.loads(done.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return  # keep all of pygments: slower copies, same behaviour
    for path in (library / "pygments").rglob("*.py"):
        if path not in used and path.name != "__init__.py":
            path.unlink()
            for compiled in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                compiled.unlink()


def create_venv(path: Path) -> Path:
    """Make a virtualenv without pip at ``path`` and return its ``bin/python``.

    Uses the interpreter that runs the grader (``sys.executable``, resolved to
    its base installation by :mod:`venv`).
    """
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=False).create(path)
    return path / "bin" / "python"


def pip_install_command(python: Path, *, package: bool, requirements: bool, find_links: str | None) -> list[str]:
    """The pip command that installs a laid-out submission into the venv of ``python``.

    Run with the submission folder as working directory.  ``package`` installs
    ``.`` (its ``pyproject.toml`` or ``setup.py``); ``requirements`` adds
    ``-r requirements.txt``.
    """
    argv = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--progress-bar",
        "off",
    ]
    if find_links:
        argv += ["--find-links", find_links]
    if requirements:
        argv += ["-r", "requirements.txt"]
    if package:
        argv.append(".")
    return argv
