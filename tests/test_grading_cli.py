"""``cellbox grade`` end to end through ``main()``: reports, one row per submission, resume, bad input."""

from __future__ import annotations

import csv
import json
import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cellbox.cli import main
from cellbox.grading.reports import CSV_FIELDS
from cellbox.verdict import COLOURS, Verdict
from grading_cases import CASES, DAEMON_MARKER, INSTRUCTOR_TOTAL, write_cases, write_suite, write_tree
from sandboxkit import survivors

QUICK = ["honest", "buggy", "missing", "early_exit"]


def grade(tmp_path: Path, *extra: str) -> int:
    return main(
        [
            "grade",
            str(tmp_path / "subs"),
            "--tests",
            str(tmp_path / "tests"),
            "--out",
            str(tmp_path / "out"),
            "--wall",
            "6",
            *extra,
        ]
    )


def rows(tmp_path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    return {row["id"]: row for row in data["submissions"]}


def grade_quick(folder: Path) -> Path:
    """``folder`` with the QUICK submissions and the suite written in it, graded with two jobs."""
    write_suite(folder / "tests")
    write_cases(folder / "subs", QUICK)
    assert grade(folder, "--jobs", "2") == 0
    return folder


@pytest.fixture
def graded(tmp_path: Path) -> Path:
    """A graded folder of this test's own, to resume or change."""
    return grade_quick(tmp_path)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One graded folder the tests that only read its reports share."""
    return grade_quick(tmp_path_factory.mktemp("reports"))


def test_results_json_has_one_row_per_submission_with_figures(reports: Path) -> None:
    header = json.loads((reports / "out" / "results.json").read_text())
    assert header["isolation"].startswith("isolation auto: ")  # the default for hostile submissions
    assert header["limits"]["wall_time"] == 6.0
    results = rows(reports)
    assert {key: row["verdict"] for key, row in results.items()} == {name: CASES[name][1] for name in QUICK}
    honest = results["honest"]
    assert honest["label"] == "TESTS VERIFIED"
    assert (honest["passed"], honest["total"], honest["score"]) == (5, 5, 100.0)
    assert honest["run"]["status"] == "ok" and honest["run"]["peak_memory"] > 0 and honest["run"]["cpu_time"] > 0
    assert {test["outcome"] for test in honest["tests"]} == {"passed"}
    assert all(test["duration"] >= 0 for test in honest["tests"])


def test_grades_csv_is_one_row_per_submission(reports: Path) -> None:
    with open(reports / "out" / "grades.csv", newline="") as handle:
        table = list(csv.reader(handle))
    assert tuple(table[0]) == CSV_FIELDS
    assert CSV_FIELDS == ("id", "verdict", "passed", "failed", "errors", "skipped", "not_run", "total", "score")
    by_id = {row[0]: row for row in table[1:]}
    assert sorted(by_id) == sorted(QUICK)
    assert by_id["honest"] == ["honest", "verified", "5", "0", "0", "0", "0", "5", "100.00"]
    assert by_id["buggy"] == ["buggy", "failed", "1", "4", "0", "0", "0", "5", "20.00"]
    # Each instructor test once: a run that collected nothing has all five not run.
    assert by_id["missing"] == ["missing", "unverified", "0", "0", "0", "0", "5", "5", "0.00"]


def test_junit_xml_has_a_testsuite_per_submission(reports: Path) -> None:
    root = ET.parse(reports / "out" / "junit.xml").getroot()
    assert root.tag == "testsuites"
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert sorted(suites) == sorted(QUICK)
    buggy = suites["buggy"]
    assert (buggy.get("tests"), buggy.get("failures"), buggy.get("errors")) == ("5", "4", "0")
    failure = buggy.find("testcase[@name='test_ten']/failure")
    assert failure is not None and failure.get("message") == "assert 10 == 55"
    missing = suites["missing"]
    error = missing.find("testcase[@name='verdict']/error")
    assert error is not None and error.get("message", "").startswith("TESTS UNVERIFIED: pytest exit 2")
    for suite in suites.values():
        assert int(suite.get("tests", "0")) == len(suite.findall("testcase"))


def test_every_report_gives_the_same_counts(reports: Path) -> None:
    suites = {suite.get("name"): suite for suite in ET.parse(reports / "out" / "junit.xml").getroot()}
    with open(reports / "out" / "grades.csv", newline="") as handle:
        table = {row["id"]: row for row in csv.DictReader(handle)}
    names = ("passed", "failed", "errors", "skipped", "not_run", "total")
    for key, row in rows(reports).items():
        counts = tuple(row[name] for name in names)
        assert tuple(int(table[key][name]) for name in names) == counts
        assert sum(counts[:-1]) == row["total"] == INSTRUCTOR_TOTAL, key
        suite = suites[key]
        # junit.xml has the same test cases, not-run ones as errors, plus the verdict case of a run not judged.
        entry = int(row["verdict"] not in ("verified", "failed"))
        junit = tuple(int(suite.get(name, "0")) for name in ("tests", "failures", "errors", "skipped"))
        assert junit == (row["total"] + entry, row["failed"], row["errors"] + row["not_run"] + entry, row["skipped"])


def test_report_html_is_self_contained_and_colours_by_exact_value(reports: Path) -> None:
    page = (reports / "out" / "report.html").read_text()
    assert "<svg" in page and page.count("<tr>") == len(QUICK) + 1
    assert not re.search(r"<script|<link|\bsrc=|@import|url\(", page)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    verified_badge = f'background:{COLOURS[Verdict.VERIFIED]}">TESTS VERIFIED<'
    assert page.count(verified_badge) == 1  # only honest; TESTS UNVERIFIED has its own colour
    assert f'background:{COLOURS[Verdict.UNVERIFIED]}">TESTS UNVERIFIED<' in page
    assert "test_fib.py::test_ten" in page  # the pass-rate chart names each test
    # Rates over all four graded submissions, passes counted only from verified and failed runs.
    assert "2/4 (50%)" in page and "1/4 (25%)" in page
    # Each failing test's message, escaped.
    assert "buggy: test_fib.py::test_ten (failed)</summary><pre>" in page and "assert 10 == 55" in page


def test_resume_grades_only_what_is_missing(graded: Path) -> None:
    first = rows(graded)
    write_cases(graded / "subs", ["own_config"])
    assert grade(graded, "--resume") == 0
    second = rows(graded)
    assert sorted(second) == sorted([*QUICK, "own_config"])
    for name in QUICK:
        assert second[name] == first[name]  # not graded again: same figures to the last digit
    assert second["own_config"]["verdict"] == "failed"


def test_resume_after_an_interrupted_run_keeps_finished_rows(graded: Path) -> None:
    data = json.loads((graded / "out" / "results.json").read_text())
    kept = data["submissions"][:2]
    (graded / "out" / "results.json").write_text(json.dumps({**data, "submissions": kept}))
    assert grade(graded, "--resume") == 0
    again = rows(graded)
    assert sorted(again) == sorted(QUICK)
    for row in kept:
        assert again[row["id"]] == row


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no_tests", "no tests found (files named test_*.py or *_test.py)"),
        ("empty_subs", "no submissions found (folders, .zip, .py or .ipynb files)"),
        ("missing_tests", "no such tests folder or test file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, message: str
) -> None:
    (tmp_path / "subs").mkdir()
    (tmp_path / "tests").mkdir()
    if setup != "empty_subs":
        write_cases(tmp_path / "subs", ["honest"])
    if setup == "empty_subs":
        write_suite(tmp_path / "tests")
    if setup == "missing_tests":
        (tmp_path / "tests").rmdir()
    assert grade(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cellbox grade: error: ") and message in err


@pytest.mark.slow
def test_many_submissions_each_get_exactly_one_row_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Task directories and the base library are made in the temp folder: here, one of this test's own.
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    write_suite(tmp_path / "tests")
    expected = write_cases(tmp_path / "subs")
    for copy in range(3):
        for name in ("honest", "buggy", "early_exit"):
            write_tree(tmp_path / "subs" / f"copy{copy}_{name}", CASES[name][0])
            expected[f"copy{copy}_{name}"] = CASES[name][1]
    assert grade(tmp_path, "--jobs", "2") == 0
    results = rows(tmp_path)
    assert {key: row["verdict"] for key, row in results.items()} == expected
    assert survivors(DAEMON_MARKER) == []
    assert list((tmp_path / "temp").iterdir()) == []


def test_tests_and_reports_inside_the_submissions_folder_are_not_graded(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    write_cases(subs, ["honest"])
    write_suite(subs / "tests")
    (subs / "out").mkdir()
    assert main(["grade", str(subs), "--tests", str(subs / "tests"), "--out", str(subs / "out"), "--wall", "6"]) == 0
    data = json.loads((subs / "out" / "results.json").read_text())
    assert [(row["id"], row["verdict"]) for row in data["submissions"]] == [("honest", "verified")]


def test_resume_against_other_tests_is_refused(graded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_suite(graded / "other_tests")
    status = main(
        [
            "grade",
            str(graded / "subs"),
            "--tests",
            str(graded / "other_tests"),
            "--out",
            str(graded / "out"),
            "--resume",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "was made with the tests in" in err and "leave out --resume" in err


def test_resume_after_an_instructor_file_changed_is_refused(graded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    test_file = graded / "tests" / "test_fib.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_one_more():\n    assert fib.fib(2) == 1\n")
    assert grade(graded, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the instructor file test_fib.py changed since that run" in err and "leave out --resume" in err


def test_names_that_are_not_utf8_or_are_formulas_make_safe_reports(tmp_path: Path) -> None:
    write_suite(tmp_path / "tests")
    subs = tmp_path / "subs"
    write_cases(subs, ["honest"])
    formula = '=HYPERLINK("x","y")'
    write_tree(subs / formula, CASES["buggy"][0])
    undecodable = subs / "caf\udce9"  # the bytes b"caf\xe9": Latin-1, not UTF-8
    write_tree(undecodable, CASES["honest"][0])
    assert grade(tmp_path, "--jobs", "2") == 0
    raw = (tmp_path / "out" / "grades.csv").read_bytes()
    raw.decode("utf-8")  # every report is UTF-8
    with open(tmp_path / "out" / "grades.csv", newline="", encoding="utf-8") as handle:
        ids = sorted(row["id"] for row in csv.DictReader(handle))
    assert ids == ["'" + formula, "caf\\xe9", "honest"]
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "caf\\xe9" in page and "&#x27;" not in page.split("<h2>Submissions</h2>")[0]
    assert ET.parse(tmp_path / "out" / "junit.xml").getroot().find("testsuite") is not None


def test_bad_isolation_option_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest"])
    assert grade(tmp_path, "--layers", "net,moon") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown isolation layer 'moon'" in err
    assert not (tmp_path / "out").exists()


def test_report_html_names_each_test_whole_however_long(tmp_path: Path) -> None:
    from cellbox.grading.evidence import TestResult
    from cellbox.grading.reports import write_html
    from cellbox.grading.results import SubmissionResult

    long_id = "test_lesson_thirteen_reading_an_outcome.py::test_limits_line_for_every_status[memory_limit-5.0]"
    results = [
        SubmissionResult(
            id=name,
            path=name,
            kind="folder",
            verdict=Verdict.VERIFIED,
            reason="",
            tests=[TestResult(long_id, outcome), TestResult("test_a.py::test_b", "passed")],
        )
        for name, outcome in (("ann", "passed"), ("bob", "failed"), ("cy", "failed"))
    ]
    page = write_html(tmp_path / "report.html", results).read_text(encoding="utf-8")
    assert len(long_id) > 90
    assert f"<code>{long_id}</code>" in page  # whole, not cut to fit a drawing
    assert "1/3 (33%)" in page and "3/3 (100%)" in page
    assert 'style="width:33.3%"' in page


def test_reduced_isolation_is_said_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest"])
    assert grade(tmp_path, "--isolation", "none") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cellbox grade: note: ")]
    assert notes == [
        "cellbox grade: note: submissions run with isolation none: rlimits and environment allowlist only; on a "
        "machine with every layer, isolation auto gives net, pid, fs, user, landlock and no network "
        "(see cellbox doctor)"
    ]


def test_grading_with_every_layer_says_nothing_of_isolation(capsys: pytest.CaptureFixture[str]) -> None:
    from cellbox.grading.cli import _note_weak_isolation
    from cellbox.sandbox.isolation import Isolation, probe

    # Silent on a machine with every layer; on one without some, the line names what is missing.
    missing = probe().missing
    _note_weak_isolation(Isolation(mode="auto"))
    err = capsys.readouterr().err
    assert (err == "") == (not missing), err
    assert all(f"{layer}: not available" in err for layer in missing)
    _note_weak_isolation(Isolation.from_options(mode="auto", network=True, source="test"))
    assert "(network allowed)" in capsys.readouterr().err
