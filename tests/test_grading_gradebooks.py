"""``cellbox grade --format gradescope,canvas``: the files course platforms import, checked against their formats.

Gradescope: the autograder specification's ``results.json``
(https://gradescope-autograders.readthedocs.io/en/latest/specs/), written below as a JSON Schema of its
fields and types, plus its rules the schema cannot say (the score of a test at most its ``max_score``, the
total the sum of the tests).  Canvas: the gradebook export's columns (``Student, ID, SIS User ID, SIS Login ID,
Section``, then ``Name (ID)`` per assignment, a ``Points Possible`` row first), which its import reads back.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import jsonschema
import pytest

from cellbox.cli import main
from cellbox.grading import evidence
from cellbox.grading.gradebooks import (
    CANVAS_FIELDS,
    gradescope_results,
    match_roster,
    read_roster,
    write_canvas,
    write_gradescope,
)
from cellbox.grading.results import SubmissionResult
from cellbox.verdict import Verdict
from grading_cases import write_cases, write_suite

_VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
GRADESCOPE_TEST = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "max_score": {"type": "number"},
        "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string"},
        "name_format": _FORMAT,
        "number": {"type": "string"},
        "output": {"type": "string"},
        "output_format": _FORMAT,
        "tags": {"type": "array", "items": {"type": "string"}},
        "visibility": _VISIBILITY,
        "extra_data": {"type": "object"},
    },
    "additionalProperties": False,
}
GRADESCOPE_RESULTS = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": _FORMAT,
        "test_output_format": _FORMAT,
        "test_name_format": _FORMAT,
        "visibility": _VISIBILITY,
        "stdout_visibility": _VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": GRADESCOPE_TEST},
        "leaderboard": {"type": "array"},
    },
    "additionalProperties": False,
}


def check_gradescope(data: dict) -> None:  # type: ignore[type-arg]
    """Fail unless ``data`` is a results.json Gradescope accepts, by the spec's fields and rules."""
    jsonschema.validate(data, GRADESCOPE_RESULTS)
    # "score" is optional only when every test has one; cellbox always gives both.
    assert "score" in data and all("score" in test and "max_score" in test for test in data["tests"])
    for test in data["tests"]:
        assert 0 <= test["score"] <= test["max_score"], test
        assert test["name"]
    assert data["score"] == sum(test["score"] for test in data["tests"])
    assert 0 <= data["score"] <= sum(test["max_score"] for test in data["tests"])


def _result(sid: str, verdict: Verdict, outcomes: list[str], reason: str = "why") -> SubmissionResult:
    tests = [
        evidence.TestResult(f"test_fib.py::test_{i}", outcome, 0.1, f"message {i}", "")
        for i, outcome in enumerate(outcomes)
    ]
    return SubmissionResult(
        id=sid, path=f"/subs/{sid}", kind="folder", verdict=verdict, reason=reason, tests=tests, duration=1.25
    )


RESULTS = [
    _result("ada", Verdict.VERIFIED, ["passed"] * 4),
    _result("bob", Verdict.FAILED, ["passed", "failed", "passed", "error"]),
    # Passes without complete evidence earn nothing, as in grades.csv.
    _result("cy", Verdict.UNVERIFIED, ["passed", "passed", "running", "not run"], reason="the run ended early"),
    _result("dee", Verdict.TIMED_OUT, [], reason="ran past 6 s"),
    _result("=HYPERLINK(1)", Verdict.VERIFIED, ["passed"]),
]


@pytest.mark.parametrize("result", RESULTS, ids=[r.id for r in RESULTS])
def test_gradescope_results_follow_the_spec(result: SubmissionResult) -> None:
    data = json.loads(json.dumps(gradescope_results(result)))
    check_gradescope(data)
    assert [test["name"] for test in data["tests"]] == [test.nodeid for test in result.tests]
    if result.tests:  # the same share as grades.csv's score
        assert round(100 * data["score"] / len(result.tests), 2) == result.score
    assert data["output"] == f"{result.verdict.label}: {result.reason}"
    assert data["extra_data"]["verdict"] == result.verdict.value


def test_gradescope_scores_each_test_by_the_verdict() -> None:
    ada, bob, cy, dee, _ = (gradescope_results(result) for result in RESULTS)
    assert (ada["score"], [t["status"] for t in ada["tests"]]) == (4.0, ["passed"] * 4)
    assert (bob["score"], [t["status"] for t in bob["tests"]]) == (2.0, ["passed", "failed", "passed", "failed"])
    assert cy["score"] == 0.0 and {t["status"] for t in cy["tests"]} == {"failed"}
    assert cy["tests"][0]["output"].startswith("passed, but not counted\nTESTS UNVERIFIED: the run ended early\n")
    assert (dee["score"], dee["tests"], dee["output"]) == (0.0, [], "TESTS TIMED OUT: ran past 6 s")


def test_gradescope_writes_one_results_json_per_submission(tmp_path: Path) -> None:
    paths = write_gradescope(tmp_path, RESULTS[:2])
    assert paths == [tmp_path / "gradescope" / "ada" / "results.json", tmp_path / "gradescope" / "bob" / "results.json"]
    check_gradescope(json.loads(paths[1].read_text()))


def _read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_canvas_csv_has_the_export_columns_a_points_row_and_a_percent_per_student(tmp_path: Path) -> None:
    path, unmatched = write_canvas(tmp_path / "canvas.csv", RESULTS, "Lab 3 (1234)")
    header, points, *rows = _read(path)
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 3 (1234)"]
    assert tuple(header[:5]) == CANVAS_FIELDS
    assert points == ["Points Possible", "", "", "", "", "100.00"]
    assert rows == [
        ["", "", "", "ada", "", "100.00"],
        ["", "", "", "bob", "", "50.00"],
        ["", "", "", "cy", "", "0.00"],
        ["", "", "", "dee", "", "0.00"],
        ["", "", "", "'=HYPERLINK(1)", "", "100.00"],  # never a formula
    ]
    for row in rows:
        assert 0.0 <= float(row[5]) <= float(points[5])
    assert unmatched == []


def test_canvas_roster_names_students_from_a_canvas_export(tmp_path: Path) -> None:
    export = tmp_path / "export.csv"
    export.write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Lab 2 (1233),Current Score\n"
        "    Points Possible,,,,,10.00,(read only)\n"
        '"Lovelace, Ada",101,S-1,ADA,Sec A,9.00,90.00\n'
        '"Brown, Bob",102,S-2,bob@uni.edu,Sec B,4.00,40.00\n',
        encoding="utf-8-sig",  # Canvas exports start with a byte-order mark
    )
    roster = read_roster(export)
    _, unmatched = write_canvas(tmp_path / "canvas.csv", RESULTS[:2], "Lab 3 (1234)", roster)
    _header, _points, ada, bob = _read(tmp_path / "canvas.csv")
    assert ada == ["Lovelace, Ada", "101", "S-1", "ADA", "Sec A", "100.00"]  # matched without case
    assert bob == ["", "", "", "bob", "", "50.00"]
    assert unmatched == ["bob"]


def test_each_canvas_student_gets_one_row_whatever_the_submissions_are_called(tmp_path: Path) -> None:
    roster = [
        {"Student": "Lovelace, Ada", "ID": "101", "SIS User ID": "S-1", "SIS Login ID": "ada", "Section": "A"},
        {"Student": "Brown, Bob", "ID": "102", "SIS User ID": "S-2", "SIS Login ID": "bob", "Section": "B"},
        {"Student": "Cole, Cy", "ID": "103", "SIS User ID": "S-3", "SIS Login ID": "CY", "Section": "C"},
    ]
    ids = ["ada", "ADA", "102", "cy", "Cy", "s-2", "nobody"]
    matched, unmatched = match_roster(ids, roster)
    # The exact login wins over the same login in another case; Canvas' ID is the weakest match, so
    # Bob's SIS User ID in another case keeps him; two equally good claims on Cy both lose him.
    assert {key: value["Student"] for key, value in matched.items()} == {"ada": "Lovelace, Ada", "s-2": "Brown, Bob"}
    assert unmatched == ["ADA", "102", "cy", "Cy", "nobody"]


def test_a_grading_run_writes_one_canvas_row_per_student(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subs, tests = tmp_path / "subs", tmp_path / "tests"
    subs.mkdir()
    tests.mkdir()
    (subs / "ada.py").write_text("def add(a, b):\n    return a + b\n")
    (subs / "ADA.py").write_text("def add(a, b):\n    return 0\n")
    (tests / "test_add.py").write_text("import submission\n\n\ndef test_add():\n    assert submission.add(1, 2) == 3\n")
    roster = tmp_path / "roster.csv"
    roster.write_text(
        'Student,ID,SIS User ID,SIS Login ID,Section,Lab (1)\nPoints Possible,,,,,100\n"Lovelace, Ada",101,S-1,ada,A,\n'
    )
    out = tmp_path / "out"
    argv = ["grade", str(subs), "--tests", str(tests), "--out", str(out), "--format", "canvas"]
    assert main([*argv, "--canvas-roster", str(roster)]) == 0
    rows = (out / "canvas.csv").read_text().splitlines()[2:]
    assert sorted(rows) == sorted(['"Lovelace, Ada",101,S-1,ada,A,100.00', ",,,ADA,,0.00"])
    assert "not matched to one student of --canvas-roster" in capsys.readouterr().err


def test_a_roster_that_is_not_a_canvas_export_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "roster.csv").write_text("name,score\nada,1\n")
    status = main(
        [
            "grade",
            str(tmp_path),
            "--tests",
            str(tmp_path),
            "--format",
            "canvas",
            "--canvas-roster",
            str(tmp_path / "roster.csv"),
        ]
    )
    assert status == 2
    assert capsys.readouterr().err == (
        f"cellbox grade: error: --canvas-roster {tmp_path / 'roster.csv'}: not a Canvas gradebook export "
        "(no column 'Student')\n"
    )


def test_unknown_format_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", str(tmp_path), "--tests", str(tmp_path), "--format", "canvas,moodle"]) == 2
    assert capsys.readouterr().err == "cellbox grade: error: --format 'moodle': choose from gradescope, canvas\n"


def test_grade_writes_gradescope_and_canvas_files_with_grades_csv_scores(tmp_path: Path) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest", "buggy"])
    out = tmp_path / "out"
    status = main(
        [
            "grade",
            str(tmp_path / "subs"),
            "--tests",
            str(tmp_path / "tests"),
            "--out",
            str(out),
            "--wall",
            "6",
            "--format",
            "gradescope,canvas",
            "--assignment",
            "Fib (77)",
        ]
    )
    assert status == 0
    with open(out / "grades.csv", newline="") as handle:
        percent = {row["id"]: row["score"] for row in csv.DictReader(handle)}
    for sid in ("honest", "buggy"):
        data = json.loads((out / "gradescope" / sid / "results.json").read_text())
        check_gradescope(data)
        assert f"{100 * data['score'] / len(data['tests']):.2f}" == percent[sid]
    header, _points, *rows = _read(out / "canvas.csv")
    assert header[-1] == "Fib (77)"
    assert {row[3]: row[5] for row in rows} == percent
    assert percent["honest"] == "100.00" and float(percent["buggy"]) < 100
