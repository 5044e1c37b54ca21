"""``cellbox lessons``: open the lesson notebooks in JupyterLab, or run them all headless and report each.

* ``cellbox lessons`` starts JupyterLab on ``lessons/`` (the notebooks carry the ``cellbox`` kernelspec, so every
  cell runs in the sandbox); without JupyterLab it prints the one command that installs it.
* ``cellbox lessons --execute [--lesson N] [--solutions]`` runs each lesson top to bottom under the ``cellbox``
  kernel with nbclient and prints one line per lesson (name, seconds, ok/failed, the first error and what its
  check cells said).  Exit status 1 when any lesson failed.

Where the lessons are: ``--dir``, else the ``lessons/`` folder of the source tree this package was installed from
(an editable install), else ``./lessons``.  Registered in :data:`cellbox.cli.FEATURE_COMMANDS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "find_lessons_dir", "select_notebooks", "execute_notebook", "LessonRun", "jupyterlab_command"]

KERNEL_NAME = "cellbox"
# Seconds one cell may take under nbclient before the lesson counts as failed; the
# kernel's own limits stop a runaway cell long before this.
CELL_TIMEOUT = 300.0
# What the check helpers of lessons/lessonkit.py print first on a line.
CHECK_PASSED, CHECK_FAILED, CHECK_TODO = "\u2714", "\u2718", "\u2026"
INSTALL_HINT = "pip install -e '.[lessons]'"


def _usage_error(message: str) -> Exception:
    from .cli import UsageError  # imported late: cli imports this module's parser

    return UsageError(message)


def find_lessons_dir(given: str | None = None) -> Path:
    """The folder holding the lesson notebooks.

    Raises:
        UsageError: ``given`` is not a folder, or no ``lessons/`` folder was found.
    """
    if given is not None:
        path = Path(given)
        if not path.is_dir():
            raise _usage_error(f"--dir {given}: no such folder")
        return path.resolve()
    for candidate in (Path(__file__).resolve().parents[2] / "lessons", Path.cwd() / "lessons"):
        if any(candidate.glob("[0-9][0-9]-*.ipynb")):
            return candidate
    raise _usage_error("no lessons/ folder found; run this from the project's folder or give --dir PATH")


def select_notebooks(folder: Path, *, lesson: int | None = None, solutions: bool = False) -> list[Path]:
    """The lesson notebooks to open or run, in order: ``NN-topic.ipynb`` (from ``solutions/`` with ``solutions``).

    Raises:
        UsageError: there is no such lesson, or no notebook at all.
    """
    base = folder / "solutions" if solutions else folder
    notebooks = sorted(base.glob("[0-9][0-9]-*.ipynb"))
    if lesson is not None:
        notebooks = [path for path in notebooks if path.name.startswith(f"{lesson:02d}-")]
        if not notebooks:
            raise _usage_error(f"--lesson {lesson}: no notebook {lesson:02d}-*.ipynb in {base}")
    if not notebooks:
        raise _usage_error(f"no lesson notebooks (NN-topic.ipynb) in {base}")
    return notebooks


@dataclasses.dataclass(frozen=True)
class LessonRun:
    """One lesson run headless.

    Attributes:
        name: the notebook's file name.
        seconds: wall-clock seconds of the whole run, kernel start included.
        ok: ``True`` when every cell ran (cells tagged ``raises-exception`` may fail) and, for solutions, every
            check cell passed.
        error: the first problem, one line (``""`` when ok).
        checks: how many check cells printed each mark: ``{"passed": 2, "failed": 0, "todo": 1}``.
    """

    name: str
    seconds: float
    ok: bool
    error: str
    checks: dict[str, int]

    def line(self) -> str:
        """One line for people: ``01-separate-process.ipynb   4.1 s  ok      checks: 1 passed``."""
        counts = ", ".join(f"{n} {word}" for word, n in self.checks.items() if n) or "none"
        text = f"{self.name:<40} {self.seconds:6.1f} s  {'ok' if self.ok else 'FAILED':<7} checks: {counts}"
        return text + (f"\n    {self.error}" if self.error else "")


def _check_marks(nb: Any) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "todo": 0}
    marks = {CHECK_PASSED: "passed", CHECK_FAILED: "failed", CHECK_TODO: "todo"}
    for cell in nb.cells:
        if "check" not in cell.get("metadata", {}).get("tags", []):
            continue
        text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
        mark = text.strip()[:1]
        counts[marks.get(mark, "failed")] += 1
    return counts


def _first_error(exc: BaseException) -> str:
    """The ``ename: evalue`` line of a CellExecutionError, or the exception's first line."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= 300 else text[:297] + "..."


def execute_notebook(path: Path, *, kernel_name: str = KERNEL_NAME, solutions: bool = False) -> LessonRun:
    """Run one notebook top to bottom with nbclient in its own folder and report it.

    A solution notebook is ok only when every check cell printed a pass; a student notebook's checks may say
    "not done yet" but must not report a crash.
    """
    import nbformat
    from nbclient import NotebookClient

    started = time.monotonic()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(path.parent)}}
    )
    error = ""
    try:
        client.execute()
    except Exception as exc:  # CellExecutionError, DeadKernelError, a kernel that would not start...
        error = _first_error(exc)
    checks = _check_marks(nb)
    if not error and checks["failed"]:
        error = f"{checks['failed']} check cell(s) reported a problem"
    if not error and solutions and checks["todo"]:
        error = f"{checks['todo']} check cell(s) say the exercise is not done"
    return LessonRun(path.name, round(time.monotonic() - started, 1), not error, error, checks)


def jupyterlab_command(folder: Path, notebook: Path | None = None) -> list[str]:
    """The command that starts JupyterLab on ``folder`` (opening ``notebook`` when given)."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    if os.geteuid() == 0:
        command.append("--allow-root")  # JupyterLab refuses to start as root without it
    if notebook is not None:
        # JupyterLab opens a path given relative to its root directory (the process's working directory).
        command.append(str(notebook.relative_to(folder)) if notebook.is_relative_to(folder) else str(notebook))
    return command


def _kernel_installed(name: str) -> bool:
    from jupyter_client.kernelspec import KernelSpecManager

    return name in KernelSpecManager().find_kernel_specs()


def _cmd_lessons(args: argparse.Namespace) -> int:
    folder = find_lessons_dir(args.dir)
    notebooks = select_notebooks(folder, lesson=args.lesson, solutions=args.solutions)
    if not _kernel_installed(args.kernel):
        raise _usage_error(f"the {args.kernel!r} kernel is not installed; run: {INSTALL_HINT} (or cellbox install)")
    if args.execute:
        return _execute_all(notebooks, args)
    if importlib.util.find_spec("jupyterlab") is None:
        print(f"cellbox lessons: JupyterLab is not installed; install it with: {INSTALL_HINT}", file=sys.stderr)
        return 1
    opened = notebooks[0] if args.lesson is not None else None
    print(f"cellbox lessons: opening JupyterLab on {folder} (kernel: {args.kernel}); stop it with Ctrl-C", flush=True)
    return subprocess.call(jupyterlab_command(folder, opened), cwd=folder)


def _execute_all(notebooks: list[Path], args: argparse.Namespace) -> int:
    failed = 0
    for path in notebooks:
        result = execute_notebook(path, kernel_name=args.kernel, solutions=args.solutions)
        failed += not result.ok
        print(result.line(), flush=True)
    print(f"cellbox lessons: {len(notebooks) - failed} of {len(notebooks)} lessons ran cleanly")
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``cellbox lessons``."""
    parser = subparsers.add_parser(
        "lessons",
        help="open the lesson notebooks in JupyterLab, or run them all (--execute)",
        description="Open JupyterLab on the lesson notebooks (cellbox kernel), or with --execute run every lesson "
        "under the kernel and report each one: name, seconds, ok or FAILED, the first error. "
        "Exit status with --execute: 0 when all ran cleanly, 1 otherwise.",
    )
    parser.add_argument("--execute", action="store_true", help="run the lessons headless (nbclient) and report each")
    parser.add_argument("--lesson", type=int, metavar="N", help="only lesson N (1, 2, ...)")
    parser.add_argument("--solutions", action="store_true", help="use the solutions (lessons/solutions/)")
    parser.add_argument("--dir", help="the lessons folder (default: lessons/ of this source tree, or ./lessons)")
    parser.add_argument("--kernel", default=KERNEL_NAME, help=f"kernel to run them with (default: {KERNEL_NAME})")
    parser.set_defaults(func=_cmd_lessons)
