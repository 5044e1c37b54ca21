"""Results files that course platforms import: Gradescope's ``results.json`` and a Canvas gradebook CSV.

``cellbox grade --format gradescope,canvas`` writes them beside ``grades.csv``
(:mod:`cellbox.grading.reports`).  Both carry the same score as ``grades.csv``:
one point per instructor test, earned only when the verdict is ``verified`` or
``failed`` (:attr:`SubmissionResult.score`); a run without complete evidence
earns nothing.

* ``gradescope/<id>/results.json``: one file per submission, in the format of
  Gradescope's autograder specification
  (https://gradescope-autograders.readthedocs.io/en/latest/specs/): ``score``,
  ``execution_time``, ``output``, and ``tests`` with ``name``, ``score``,
  ``max_score``, ``status`` (``passed`` or ``failed``) and ``output``.  On
  Gradescope the autograder copies the one file to
  ``/autograder/results/results.json``.
* ``canvas.csv``: Canvas' gradebook import (the columns of its gradebook
  export): ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``,
  ``Section``, then one column per assignment named ``Name (ID)``, and a
  ``Points Possible`` row first.  The score is in points out of 100.  Students
  are named by their Canvas export (``--canvas-roster``), matched by the
  submission's id; without it the id goes to ``SIS Login ID``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ..verdict import Verdict
from .reports import clean, csv_cell
from .results import SubmissionResult

__all__ = [
    "FORMATS",
    "CANVAS_FIELDS",
    "RosterError",
    "gradescope_results",
    "write_gradescope",
    "read_roster",
    "match_roster",
    "write_canvas",
]

FORMATS = ("gradescope", "canvas")
# The identity columns of a Canvas gradebook export, in its order; assignments follow.
CANVAS_FIELDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS_ROW = "Points Possible"
CANVAS_POINTS = 100.0  # canvas.csv scores are percents: points out of 100
GRADESCOPE_OUTPUT_KEPT = 8_000  # characters of a test's message and output kept in its "output"


class RosterError(ValueError):
    """A ``--canvas-roster`` file that is not a Canvas gradebook export; the message names the file."""


def _counted(result: SubmissionResult) -> bool:
    """Whether the run's passes count (the same rule as :attr:`SubmissionResult.score`)."""
    return result.verdict in (Verdict.VERIFIED, Verdict.FAILED)


def _test_entry(result: SubmissionResult, index: int) -> dict[str, Any]:
    test = result.tests[index]
    passed = test.outcome in ("passed", "xpassed")
    scored = test.outcome not in ("skipped", "xfailed")  # not scored, as in SubmissionResult.score
    earned = 1.0 if passed and _counted(result) else 0.0
    lines = [test.outcome if earned or not passed else f"{test.outcome}, but not counted"]
    if passed and not earned:
        lines.append(f"{result.verdict.label}: {result.reason}")
    lines += [text for text in (test.message, test.output) if text]
    output = clean("\n".join(lines))
    if len(output) > GRADESCOPE_OUTPUT_KEPT:
        output = output[:GRADESCOPE_OUTPUT_KEPT] + "\n[... cut]"
    return {
        "name": clean(test.nodeid),
        "number": str(index + 1),
        "score": earned,
        "max_score": 1.0 if scored else 0.0,
        "status": "passed" if earned or not scored else "failed",
        "output": output,
    }


def gradescope_results(result: SubmissionResult) -> dict[str, Any]:
    """One submission's ``results.json`` for Gradescope, as a JSON-ready dict.

    One point per scored instructor test (``max_score`` 1.0; a skipped or
    ``xfailed`` test has ``max_score`` 0.0); ``score`` is the sum of the tests'
    scores, so ``score`` over the sum of ``max_score`` is
    :attr:`SubmissionResult.score` in percent.  ``extra_data`` keeps cellbox's verdict.
    """
    tests = [_test_entry(result, index) for index in range(len(result.tests))]
    return {
        "score": sum(test["score"] for test in tests),
        "execution_time": round(result.duration, 3),
        "output": clean(f"{result.verdict.label}: {result.reason}"),
        "tests": tests,
        "extra_data": {"verdict": result.verdict.value, "percent": result.score},
    }


def write_gradescope(out: Path, results: list[SubmissionResult]) -> list[Path]:
    """Write ``out/gradescope/<id>/results.json`` for each submission; return the paths."""
    paths = []
    for result in results:
        folder = out / "gradescope" / clean(result.id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "results.json"
        path.write_text(json.dumps(gradescope_results(result), indent=1) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def read_roster(path: Path) -> list[dict[str, str]]:
    """Read a Canvas gradebook export: each student's identity columns (:data:`CANVAS_FIELDS`).

    The ``Points Possible`` row is skipped; :func:`match_roster` pairs
    submissions with students.

    Raises:
        RosterError: the file cannot be read or lacks the columns of :data:`CANVAS_FIELDS`.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.DictReader(handle))
            header = rows[0].keys() if rows else []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RosterError(f"--canvas-roster {path}: cannot read it: {exc}") from None
    lacking = [name for name in CANVAS_FIELDS if name not in header]
    if lacking:
        raise RosterError(f"--canvas-roster {path}: not a Canvas gradebook export (no column {lacking[0]!r})")
    return [
        {name: row.get(name) or "" for name in CANVAS_FIELDS}
        for row in rows
        if (row.get("Student") or "").strip() != CANVAS_POINTS_ROW
    ]


# How well a submission id names a student, best first: its SIS Login ID or SIS User ID as written, the same
# without regard to case, then Canvas' own ID.
_MATCHES = (
    ("SIS Login ID", False),
    ("SIS User ID", False),
    ("SIS Login ID", True),
    ("SIS User ID", True),
    ("ID", False),
)


def _rank(submission: str, identity: dict[str, str]) -> int | None:
    """The index in :data:`_MATCHES` of the best way ``submission`` names ``identity``, or ``None``."""
    for rank, (key, folded) in enumerate(_MATCHES):
        value = identity[key]
        if value and (value.casefold() == submission.casefold() if folded else value == submission):
            return rank
    return None


def match_roster(ids: list[str], roster: list[dict[str, str]]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Pair submission ids with roster students: at most one submission per student, one student per submission.

    Each submission takes the student it names best (:data:`_MATCHES`); when
    several name one student, the best match keeps the student and the others
    are unmatched; two equally good ones both are (which is the student's is
    not for the grader to guess).  Returns ``({id: identity}, [unmatched ids])``.
    """
    claims: dict[int, list[tuple[int, str]]] = {}
    unmatched = []
    for submission in ids:
        ranked = [
            (rank, index) for index, identity in enumerate(roster) if (rank := _rank(submission, identity)) is not None
        ]
        if not ranked:
            unmatched.append(submission)
            continue
        best = min(rank for rank, _index in ranked)
        students = [index for rank, index in ranked if rank == best]
        if len(students) > 1:
            unmatched.append(submission)  # names two students equally well
            continue
        claims.setdefault(students[0], []).append((best, submission))
    matched = {}
    for index, claimants in claims.items():
        best = min(rank for rank, _submission in claimants)
        winners = [submission for rank, submission in claimants if rank == best]
        if len(winners) == 1:
            matched[winners[0]] = roster[index]
        unmatched += [submission for _rank_, submission in claimants if len(winners) > 1 or submission != winners[0]]
    return matched, [submission for submission in ids if submission in unmatched]


def write_canvas(
    path: Path, results: list[SubmissionResult], assignment: str, roster: list[dict[str, str]] | None = None
) -> tuple[Path, list[str]]:
    """Write a Canvas gradebook import with one assignment column; return the path and the unmatched ids.

    Args:
        path: the CSV to write.
        results: one row each, score in points out of :data:`CANVAS_POINTS`.
        assignment: the column's header, as Canvas exports it (``Lab 3 (1234)``);
            a name without an id makes Canvas create a new assignment.
        roster: from :func:`read_roster`; ``None`` puts each id in ``SIS Login ID``.
            Each student gets at most one row (see :func:`match_roster`); a
            submission without one gets its own row, its id in ``SIS Login ID``.
    """
    matched, unmatched = match_roster([result.id for result in results], roster or [])
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*CANVAS_FIELDS, csv_cell(assignment)])
        writer.writerow([CANVAS_POINTS_ROW, "", "", "", "", f"{CANVAS_POINTS:.2f}"])
        for result in results:
            identity = matched.get(result.id)
            if identity is None:
                identity = {**dict.fromkeys(CANVAS_FIELDS, ""), "SIS Login ID": result.id}
            writer.writerow([csv_cell(identity[name]) for name in CANVAS_FIELDS] + [f"{result.score:.2f}"])
    return path, unmatched if roster is not None else []
