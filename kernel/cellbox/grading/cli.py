"""``cellbox grade SUBMISSIONS --tests TESTS [--out DIR] [--jobs N] [--dask ADDRESS] [--resume] [limits]``.

Registered in :data:`cellbox.cli.FEATURE_COMMANDS`.  Exit status: 0 when every
submission has its row in the reports (whatever the verdicts), 2 for bad
input (one line on stderr), 130 when interrupted (the rows finished so far are
kept in ``results.json``; ``--resume`` finishes the rest).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Add the ``grade`` subcommand to ``cellbox``'s parser."""
    from ..options import add_limit_options
    from ..sandbox.isolation import add_isolation_options
    from .task import GRADE_ISOLATION

    parser = subparsers.add_parser(
        "grade",
        help="grade a folder of submissions against hidden pytest tests",
        description="Grade each submission in SUBMISSIONS (folders, .zip, .py, .ipynb) in its own sandboxed "
        "virtualenv against the pytest tests in TESTS. Verdicts: verified, failed, unverified, timed_out. "
        "Reports in --out: results.json, grades.csv, junit.xml, report.html, and with --format the files "
        "course platforms import.",
        epilog="exit status: 0 every submission has its row in the reports, whatever its verdict; 2 bad input; "
        "130 interrupted (--resume finishes the rest)",
    )
    parser.add_argument("submissions", metavar="SUBMISSIONS", help="folder that holds one entry per submission")
    parser.add_argument("--tests", required=True, metavar="TESTS", help="folder of instructor tests, or one test file")
    parser.add_argument(
        "--out", default="grading-results", metavar="DIR", help="folder for the reports (default: ./grading-results)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="submissions graded at once (default: the number of cores)",
    )
    parser.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="grade on this dask.distributed scheduler instead: a tls:// address, with client credentials in "
        "the dask config (workers share the filesystem), or 'local' for a cluster of --jobs workers of this run",
    )
    parser.add_argument(
        "--modules",
        metavar="NAME,...",
        help="the submission's own modules, exactly; without it, the names the submission offers that are not "
        "well-known libraries (docs/grading.md, 'Whose modules')",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of an earlier results.json in --out; grade only the missing ones",
    )
    parser.add_argument(
        "--find-links",
        metavar="PATH_OR_URL",
        help="wheels pip may install from when a submission has a package or requirements.txt",
    )
    parser.add_argument(
        "--test-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="seconds each test may spend in calls into the submission, unless it has a "
        "@pytest.mark.timeout (default: only --wall, for all the tests together)",
    )
    group = parser.add_argument_group("gradebooks")
    group.add_argument(
        "--format",
        default="",
        metavar="FORMATS",
        help="also write these, comma-separated: gradescope (gradescope/ID/results.json, Gradescope's "
        "autograder results) and canvas (canvas.csv, a Canvas gradebook import)",
    )
    group.add_argument(
        "--assignment",
        metavar="NAME",
        help="canvas.csv's assignment column, as Canvas exports it: 'Lab 3 (1234)' fills assignment "
        "1234; a name without an id creates one (default: the name of TESTS)",
    )
    group.add_argument(
        "--canvas-roster",
        metavar="CSV",
        help="a Canvas gradebook export: fills each student's name, IDs and section in canvas.csv, "
        "matched by submission id to SIS Login ID, SIS User ID or ID",
    )
    add_limit_options(parser)
    add_isolation_options(parser, default=GRADE_ISOLATION)
    parser.set_defaults(func=_cmd_grade)


def _seconds(text: str) -> float:
    """A ``--test-timeout`` value: ``5``, ``2.5s``, ``1m``."""
    from ..sandbox.limits import LimitError, parse_time

    try:
        value = parse_time(text)
    except LimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return float(value)


def _cmd_grade(args: argparse.Namespace) -> int:
    from .reports import write_reports
    from .runner import print_summary

    formats, roster = _formats(args)
    grading = _grading_run(args)
    _note_weak_isolation(grading.settings.isolation)
    results = _grade(grading)
    paths = write_reports(grading.out, results, grading.header())
    names = [path.name for path in paths]
    names += _write_gradebooks(args, grading, results, formats, roster)
    print_summary(results)
    print(f"cellbox grade: reports in {grading.out}/ ({', '.join(names)}, results.json)", file=sys.stderr)
    return 0


def _formats(args: argparse.Namespace) -> tuple[list[str], list[dict[str, str]] | None]:
    """The ``--format`` names and the ``--canvas-roster`` read, checked before any grading."""
    from ..cli import UsageError
    from .gradebooks import FORMATS, RosterError, read_roster

    formats = [name.strip() for name in args.format.split(",") if name.strip()]
    for name in formats:
        if name not in FORMATS:
            raise UsageError(f"--format {name!r}: choose from {', '.join(FORMATS)}")
    if (args.canvas_roster or args.assignment) and "canvas" not in formats:
        raise UsageError("--assignment and --canvas-roster are for canvas.csv: add --format canvas")
    try:
        roster = read_roster(Path(args.canvas_roster)) if args.canvas_roster else None
    except RosterError as exc:
        raise UsageError(str(exc)) from None
    return formats, roster


def _write_gradebooks(
    args: argparse.Namespace,
    grading: Any,
    results: list[Any],
    formats: list[str],
    roster: list[dict[str, str]] | None,
) -> list[str]:
    """Write the ``--format`` files; return their names for the closing line."""
    from .gradebooks import write_canvas, write_gradescope

    names = []
    if "gradescope" in formats:
        write_gradescope(grading.out, results)
        names.append("gradescope/ID/results.json")
    if "canvas" in formats:
        assignment = args.assignment or Path(args.tests).resolve().stem
        path, unmatched = write_canvas(grading.out / "canvas.csv", results, assignment, roster)
        names.append(path.name)
        if unmatched:
            print(
                f"cellbox grade: warning: {len(unmatched)} submission(s) not matched to one student of "
                f"--canvas-roster (no student, or a student another submission names as well or better), "
                f"written with the id as SIS Login ID: {', '.join(unmatched)}",
                file=sys.stderr,
            )
    return names


def _grading_run(args: argparse.Namespace) -> Any:
    """The :class:`~cellbox.grading.runner.GradingRun` the options ask for; bad input is a one-line UsageError."""
    from ..cli import UsageError
    from ..options import limits_from_args
    from ..sandbox.isolation import IsolationError, isolation_from_args
    from .runner import GradingRun
    from .submissions import SubmissionError, discover
    from .task import GRADE_ISOLATION, GradeSettings, Suite, SuiteError

    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more")
    try:
        isolation = isolation_from_args(args, GRADE_ISOLATION)
    except IsolationError as exc:
        raise UsageError(str(exc)) from None
    _check_strict(isolation)
    if args.dask and args.dask != "local":
        from .cluster import ClusterError, cluster_security

        try:
            cluster_security(args.dask)  # an unauthenticated address stops here, before any collection
        except ClusterError as exc:
            raise UsageError(str(exc)) from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a folder")
    try:
        modules = tuple(n.strip() for n in args.modules.split(",") if n.strip()) if args.modules else None
        suite = Suite.find(args.tests, modules)
        # The reports folder and the tests may sit inside the submissions folder: they are not submissions.
        own = {str(out.resolve()), str(suite.root)}
        submissions = [item for item in discover(args.submissions) if item.path not in own]
    except (SuiteError, SubmissionError) as exc:
        raise UsageError(str(exc)) from None
    if not submissions:
        raise UsageError(f"{args.submissions}: no submissions found besides the tests and the reports")
    limits = limits_from_args(args)
    settings = GradeSettings(
        limits=limits, find_links=_find_links(args.find_links), isolation=isolation, test_timeout=args.test_timeout
    )
    return GradingRun(
        submissions=submissions,
        suite=suite,
        settings=settings,
        out=out,
        jobs=args.jobs,
        dask=args.dask,
        resume=args.resume,
    )


def _grade(grading: Any) -> list[Any]:
    """Grade; the failures that are the user's to fix (scheduler, pytest missing, --resume) become UsageError."""
    from ..cli import UsageError
    from .cluster import ClusterError
    from .runner import ResumeError
    from .venvs import SetupError

    try:
        return _grade_with_progress(grading)
    except (ClusterError, SetupError, ResumeError) as exc:
        raise UsageError(str(exc)) from None


def _check_strict(isolation: Any) -> None:
    """With ``--isolation strict``, a layer this machine lacks stops the grading before any submission."""
    from ..cli import UsageError
    from ..sandbox.isolation import make_plan, probe

    if isolation.mode != "strict":
        return
    missing = make_plan(isolation, probe(), user=None).missing
    if missing:
        layer, why = next(iter(missing.items()))
        raise UsageError(f"--isolation strict: the {layer} layer is not available here: {why} (see cellbox doctor)")


def _note_weak_isolation(isolation: Any) -> None:
    """One line on stderr when submissions get less than ``auto`` gives on a machine with every layer.

    ``results.json`` records the isolation in any case; this line is for the instructor at the terminal, who
    chose ``--isolation none``, allowed the network, or is on a machine without some layer (``cellbox doctor``).
    """
    from ..sandbox.isolation import LAYERS, describe, make_plan, probe

    support = probe()
    active = [layer for layer in make_plan(isolation, support, user=None).layers if layer in LAYERS]
    if active != list(LAYERS) or isolation.network:
        print(
            f"cellbox grade: note: submissions run with {describe(isolation, support)}; on a machine with every "
            f"layer, isolation auto gives {', '.join(LAYERS)} and no network (see cellbox doctor)",
            file=sys.stderr,
        )


def _find_links(value: str | None) -> str | None:
    """A local --find-links path made absolute (pip runs in each submission's folder); URLs as given."""
    if value and os.path.exists(value):
        return os.path.abspath(value)
    return value


def _grade_with_progress(grading: Any) -> list[Any]:
    """Grade with a rich progress bar on stderr (shown only on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..verdict import STYLES

    console = Console(stderr=True)
    with Progress(
        TextColumn("grading"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=not console.is_terminal,
        transient=False,
    ) as progress:
        bar = progress.add_task("", total=len(grading.submissions))

        def on_start(pending: int) -> None:
            progress.update(bar, total=pending)

        def on_result(result: Any) -> None:
            progress.update(
                bar, advance=1, description=f"[{STYLES[result.verdict]}]{result.id}: {result.verdict.label}"
            )

        return list(grading.grade(on_result=on_result, on_start=on_start))
