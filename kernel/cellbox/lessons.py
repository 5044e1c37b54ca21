"""``cellbox lessons``: open the lesson notebooks in JupyterLab, or run them all headless and report each.

* ``cellbox lessons`` copies the notebooks into the student's own folder (``~/cellbox-lessons``, or ``--into``;
  ``solutions/`` and ``grading/`` stay behind) and starts JupyterLab there (the notebooks carry the ``cellbox``
  kernelspec, so every cell runs in the sandbox); Ctrl-C stops it and its kernels cleanly.  Without JupyterLab
  it prints the one command that installs it.  ``--solutions`` opens the lessons folder itself.
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
import urllib.parse
from pathlib import Path
from typing import Any

__all__ = [
    "add_parser",
    "find_lessons_dir",
    "select_notebooks",
    "execute_notebook",
    "LessonRun",
    "jupyterlab_command",
    "check_kernel",
    "student_copy",
    "serve_jupyterlab",
]

KERNEL_NAME = "cellbox"
# Seconds one cell may take under nbclient before the lesson counts as failed; the
# kernel's own limits stop a runaway cell long before this.
CELL_TIMEOUT = 300.0
# What the check helpers of lessons/lessonkit.py print first on a line.
CHECK_PASSED, CHECK_FAILED, CHECK_TODO = "\u2714", "\u2718", "\u2026"
INSTALL_HINT = "pip install -e '.[lessons]'"
# Files beside the notebooks that a student's copy needs (the notebooks import them).
STUDENT_FILES = ("lessonkit.py",)
DEFAULT_COPY = "cellbox-lessons"  # the student's copy, in the home directory unless --into says otherwise
STOP_GRACE = 30.0  # seconds JupyterLab gets to stop its kernels after Ctrl-C before it is killed


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
        said: what each check cell that did not pass said, one line each, in notebook order (for solutions,
            "not done yet" lines too; for student notebooks only the failures).
    """

    name: str
    seconds: float
    ok: bool
    error: str
    checks: dict[str, int]
    said: tuple[str, ...] = ()

    def line(self) -> str:
        """Lines for people: ``01-separate-process.ipynb   4.1 s  ok      checks: 1 passed``, then each problem."""
        counts = ", ".join(f"{n} {word}" for word, n in self.checks.items() if n) or "none"
        text = f"{self.name:<40} {self.seconds:6.1f} s  {'ok' if self.ok else 'FAILED':<7} checks: {counts}"
        details = [self.error] if self.error else []
        details += [line for line in self.said if line != self.error]
        return text + "".join(f"\n    {line}" for line in details)


def _check_cells(nb: Any) -> list[tuple[str, str]]:
    """``(outcome, what the cell printed)`` for each check cell: outcome ``passed``, ``failed`` or ``todo``."""
    marks = {CHECK_PASSED: "passed", CHECK_FAILED: "failed", CHECK_TODO: "todo"}
    found = []
    for cell in nb.cells:
        if "check" not in cell.get("metadata", {}).get("tags", []):
            continue
        text = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
        errors = [
            f"{out.get('ename')}: {out.get('evalue')}"
            for out in cell.get("outputs", [])
            if out.get("output_type") == "error"
        ]
        said = text.strip() or "; ".join(errors) or "the check cell printed nothing"
        found.append((marks.get(text.strip()[:1], "failed"), _one_line(said)))
    return found


def _check_marks(nb: Any) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "todo": 0}
    for outcome, _said in _check_cells(nb):
        counts[outcome] += 1
    return counts


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


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
    shown = ("failed", "todo") if solutions else ("failed",)
    said = tuple(text for outcome, text in _check_cells(nb) if outcome in shown)
    if not error and checks["failed"]:
        error = f"{checks['failed']} check cell(s) reported a problem:"
    if not error and solutions and checks["todo"]:
        error = f"{checks['todo']} check cell(s) say the exercise is not done:"
    return LessonRun(path.name, round(time.monotonic() - started, 1), not error, error, checks, said)


def jupyterlab_command(folder: Path, notebook: Path | None = None) -> list[str]:
    """The command that starts JupyterLab on ``folder`` (opening ``notebook`` when given)."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    if os.geteuid() == 0:
        command.append("--allow-root")  # JupyterLab refuses to start as root without it
    if notebook is not None:
        # The notebook's page as the server's default URL: the browser opens it, and the URLs the server
        # prints (to copy over SSH or without a browser) lead there too, not to the launcher.
        relative = notebook.relative_to(folder) if notebook.is_relative_to(folder) else notebook
        command.append(f"--LabApp.default_url=/lab/tree/{urllib.parse.quote(relative.as_posix())}")
    return command


def student_copy(folder: Path, target: Path) -> list[Path]:
    """Copy the lessons a student works in (``NN-topic.ipynb`` and the helpers they import) into ``target``.

    ``solutions/``, ``grading/`` and the notebooks' sources stay behind, so the answers are not one click away
    in JupyterLab's file browser.  A file already in ``target`` is kept as it is: it holds the student's work.

    Returns:
        the files copied this time (none when ``target`` is already complete).

    Raises:
        UsageError: ``target`` exists and is not a folder, or cannot be written.
    """
    import shutil

    if target.exists() and not target.is_dir():
        raise _usage_error(f"--into {target}: exists and is not a folder")
    copied = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for source in [*sorted(folder.glob("[0-9][0-9]-*.ipynb")), *(folder / name for name in STUDENT_FILES)]:
            if source.is_file() and not (target / source.name).exists():
                shutil.copy2(source, target / source.name)
                copied.append(target / source.name)
    except OSError as exc:
        raise _usage_error(f"--into {target}: cannot copy the lessons there: {exc.strerror or exc}") from None
    return copied


def serve_jupyterlab(command: list[str], cwd: Path, *, grace: float = STOP_GRACE) -> int:
    """Run JupyterLab until it ends or cellbox gets Ctrl-C (SIGINT) or SIGTERM, then stop it cleanly.

    JupyterLab runs in a session of its own, so a Ctrl-C at the terminal reaches only cellbox, which asks the
    server to stop with SIGTERM: jupyter_server then shuts its kernels down and removes its
    ``jpserver-*.json`` (which holds the login token) from the runtime directory.  A SIGINT straight to the
    server would ask "Shut down this Jupyter server (y/[n])?" on a terminal, and without one end it with
    neither of those done.  A server still running ``grace`` seconds later, or a second Ctrl-C, is killed.

    Returns:
        JupyterLab's exit status when it ended by itself; 0 when it stopped cleanly after Ctrl-C; 1 when it
        had to be killed.
    """
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    process = subprocess.Popen(command, cwd=cwd, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        try:
            return process.wait()
        except KeyboardInterrupt:
            print("\ncellbox lessons: stopping JupyterLab and its kernels", file=sys.stderr, flush=True)
            process.terminate()
        try:
            process.wait(grace)
            print("cellbox lessons: JupyterLab stopped", file=sys.stderr)
            return 0
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            print("cellbox lessons: JupyterLab did not stop in time and was killed", file=sys.stderr)
            return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_kernel(name: str, option: str = "--kernel") -> None:
    """Make sure Jupyter has a kernelspec called ``name``.

    Raises:
        UsageError: it has none; the message names the kernels that exist (``jupyter kernelspec list``).
    """
    from jupyter_client.kernelspec import KernelSpecManager

    found = sorted(KernelSpecManager().find_kernel_specs())
    if name not in found:
        there = ", ".join(found) if found else "none"
        raise _usage_error(f"{option} {name}: no such kernel; the kernels Jupyter knows here: {there}")


def _cmd_lessons(args: argparse.Namespace) -> int:
    folder = find_lessons_dir(args.dir)
    notebooks = select_notebooks(folder, lesson=args.lesson, solutions=args.solutions)
    check_kernel(args.kernel)
    if args.execute:
        return _execute_all(notebooks, args)
    if importlib.util.find_spec("jupyterlab") is None:
        print(f"cellbox lessons: JupyterLab is not installed; install it with: {INSTALL_HINT}", file=sys.stderr)
        return 1
    if not args.solutions:
        # Students work in a copy of their own, without solutions/ and grading/ beside it.
        source, folder = folder, Path(args.into).expanduser() if args.into else Path.home() / DEFAULT_COPY
        copied = student_copy(source, folder)
        notebooks = [folder / path.name for path in notebooks]
        if copied:
            print(f"cellbox lessons: copied {len(copied)} files from {source} into {folder}", flush=True)
    opened = notebooks[0] if args.lesson is not None else None
    print(f"cellbox lessons: opening JupyterLab on {folder} (kernel: {args.kernel}); stop it with Ctrl-C", flush=True)
    return serve_jupyterlab(jupyterlab_command(folder, opened), folder)


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
        description="Open JupyterLab on your own copy of the lesson notebooks (cellbox kernel; the solutions "
        "and the grading tests stay out of it), or with --execute run every lesson under the kernel and report "
        "each one: name, seconds, ok or FAILED, the first error and what each failed check said.",
        epilog="exit status: 0 JupyterLab stopped (Ctrl-C) or every lesson ran cleanly; 1 a lesson failed, or "
        "JupyterLab had to be killed or is not installed; 2 bad input",
    )
    parser.add_argument("--execute", action="store_true", help="run the lessons headless (nbclient) and report each")
    parser.add_argument("--lesson", type=int, metavar="N", help="only lesson N (1, 2, ...)")
    parser.add_argument("--solutions", action="store_true", help="use the solutions (lessons/solutions/)")
    parser.add_argument("--dir", help="the lessons folder (default: lessons/ of this source tree, or ./lessons)")
    parser.add_argument(
        "--into",
        metavar="DIR",
        help=f"your copy of the lessons, made on first use; files already there are kept (default: ~/{DEFAULT_COPY})",
    )
    parser.add_argument("--kernel", default=KERNEL_NAME, help=f"kernel to run them with (default: {KERNEL_NAME})")
    parser.set_defaults(func=_cmd_lessons)
