"""Virtualenvs for grading: one worker library per grading run, one fresh venv per submission.

* :class:`BaseLibrary` is built once per grading run, in a directory of the
  grader's: what the submission's process needs to answer the trusted test
  process (:mod:`cellbox.grading.bridge`), and nothing else: the worker
  (:mod:`cellbox.grading.worker` as ``cellbox_worker``), the plain-data
  encoding (:mod:`cellbox.grading.plain` as ``cellbox_plain``) and execnet's
  ``gateway_base`` (as ``cellbox_gateway_base``; standard library only),
  byte-compiled once.  pytest, the tests and the reporter never go there:
  they run in the trusted process, from the grader's own installation.
* each task gets a copy of that library in its task directory (three small
  files: a submission that changes them changes only its own process) and a
  new virtualenv made with :mod:`venv` without pip
  (``python -m venv --without-pip``: a ``pyvenv.cfg`` and a symlink, a few
  milliseconds).

Installs run the grader's pip against the task's interpreter
(``pip --python VENV_PYTHON``, pip >= 22.3) inside the sandbox, with the
submission's limits and scrubbed environment (build backends are code), and
offline: ``--no-index --find-links WHEELHOUSE``, the wheels the grader's side
fetched beforehand (:mod:`cellbox.grading.wheelhouse`), with the network off.
Build isolation stays on: pip builds the package in a fresh environment with
the backend the package declares, from the wheelhouse.  In the install's view
the grader's site directories are empty but for pip
(:func:`grader_site_hidden`): nothing of the grader's (``distributed``, its
cluster client) is there to borrow.
"""

from __future__ import annotations

import compileall
import importlib.machinery
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

__all__ = [
    "BaseLibrary",
    "SetupError",
    "WORKER_MODULES",
    "create_venv",
    "grader_site_hidden",
    "pip_install_command",
    "readable_by_all",
]

# Module name in the submission's process -> where the grader takes it from.
WORKER_MODULES = {
    "cellbox_worker": ("cellbox.grading.worker", None),
    "cellbox_plain": ("cellbox.grading.plain", None),
    "cellbox_gateway_base": ("execnet.gateway_base", "execnet"),
}


class SetupError(RuntimeError):
    """The grader cannot prepare its own files (execnet missing beside it); one line, for the command line."""


class BaseLibrary:
    """The submission side's library (the worker and what it imports), built once per grading run.

    Use :meth:`build` (or as a context manager); :meth:`copy_to` gives a task its
    own copy; :meth:`remove` deletes it.  Safe to share between threads: it
    is only read after :meth:`build`.

    Attributes:
        path: the directory holding the modules (put first on the submission's ``sys.path``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def build(cls, parent: str | os.PathLike[str] | None = None) -> BaseLibrary:
        """Copy the worker's modules into a new directory and byte-compile them.

        Raises:
            SetupError: a module is not installed beside the grader.
        """
        root = Path(tempfile.mkdtemp(prefix="cellbox-base-", dir=parent))
        library = root / "lib"
        try:
            library.mkdir()
            for name, (source, distribution) in WORKER_MODULES.items():
                spec = importlib.util.find_spec(source)
                if spec is None or spec.origin is None:
                    raise SetupError(
                        f"{distribution or source} is not installed beside cellbox; "
                        f"install it with pip (pip install {distribution or 'cellbox'})"
                    )
                shutil.copy2(spec.origin, library / f"{name}.py")
            # Compiled once here; copies keep the mtimes (copy2), so the .pyc stay valid
            # in the task even though its children never write bytecode.
            compileall.compile_dir(library, quiet=2, workers=1)
            readable_by_all(root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(library)

    def copy_to(self, dest: Path) -> Path:
        """Copy the library to ``dest`` (a new directory) and return it.

        Raises:
            FileNotFoundError: the library was removed.
        """
        shutil.copytree(self.path, dest, copy_function=shutil.copy2)
        return dest

    def remove(self) -> None:
        """Delete the library (idempotent)."""
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def __enter__(self) -> BaseLibrary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def readable_by_all(root: Path) -> None:
    """Folders 0755 and files 0644 below ``root``: every user may read the library, only its owner write it.

    Symlinks are left as they are, never followed (os.chmod would change their target).
    """
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if name in dirs else 0o644)
    os.chmod(root, 0o755)


def create_venv(path: Path) -> Path:
    """Make a virtualenv without pip at ``path`` and return its ``bin/python``.

    Uses the interpreter that runs the grader (``sys.executable``, resolved to
    its base installation by :mod:`venv`).
    """
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=False).create(path)
    return path / "bin" / "python"


def pip_install_command(python: Path, *, package: bool, requirements: bool, wheelhouse: Path) -> list[str]:
    """The offline pip command that installs a laid-out submission into the venv of ``python``.

    Run with the submission folder as working directory.  ``package`` installs
    ``.`` (its ``pyproject.toml`` or ``setup.py``); ``requirements`` adds
    ``-r requirements.txt``.  Every distribution, build backends included, comes
    from ``wheelhouse`` (``--no-index``): pip itself never reaches an index.
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
        "--no-index",
        "--find-links",
        str(wheelhouse),
    ]
    if requirements:
        argv += ["-r", "requirements.txt"]
    if package:
        argv.append(".")
    return argv


def grader_site_hidden(keep: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(hidden, shown)``: the grader's site directories to cover in a sandbox's view, and what to bind back.

    The view binds the grader's Python whole (:func:`cellbox.sandbox.isolation.python_paths`),
    and with it every package installed beside cellbox (``distributed``,
    which talks to the grader's cluster).  A submission's install and its
    process need none of them but ``keep`` (``("pip",)`` for the install):
    ``hidden`` are the site directories (this Python's, its base
    installation's, the user's), for :attr:`Isolation.hidden`; ``shown`` the
    kept packages inside them, for :attr:`Isolation.read_only`.  The
    sandbox's own launcher lies outside them, or is bound on top by the view.
    """
    sites = [*site.getsitepackages(), site.getusersitepackages() if site.ENABLE_USER_SITE else ""]
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
        sites += [paths["purelib"], paths["platlib"]]
    hidden = tuple(dict.fromkeys(os.path.normpath(p) for p in sites if p and os.path.isdir(p)))
    shown = []
    for name in keep:
        # The path finder alone: importlib.util.find_spec("pip") goes through setuptools' distutils hack,
        # whose spec_for_pip turns its own distutils off for the rest of the process (pypa/pip#8761), and a
        # later import of setuptools here (nbgrader does) then fails.
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            shown += list(spec.submodule_search_locations)  # the package this Python imports, not a shadowed one
    return hidden, tuple(dict.fromkeys(shown))
