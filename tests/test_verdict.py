"""The verdict: exact values and labels, styles by exact value, and the mapping from exit code, evidence and Outcome.

The mapping is a pure function; these tests hand it the inputs a real run would
produce (real runs are in test_grading_verdicts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cellbox.sandbox.outcome import Outcome, Status
from cellbox.verdict import COLOURS, LABELS, STYLES, Evidence, Verdict, judge, verdict_for

TESTS = ("test_a.py::test_one", "test_a.py::test_two")


def outcome(status: Status = Status.OK, exit_code: int | None = 0, **fields: Any) -> Outcome:
    values: dict[str, Any] = dict(
        status=status,
        exit_code=exit_code,
        signal=None,
        wall_time=0.5,
        cpu_time=0.4,
        peak_memory=1 << 20,
        stdout="",
        stderr="",
        truncated=False,
        limits={"wall_time": 30.0},
    )
    values.update(fields)
    return Outcome(**values)


def complete(exit_status: int = 0, **outcomes: str) -> Evidence:
    results = {nodeid: outcomes.get(nodeid.split("::")[1], "passed") for nodeid in TESTS}
    return Evidence(started=True, collected=TESTS, outcomes=results, finished=True, exit_status=exit_status)


def test_values_and_labels_are_the_design_words() -> None:
    assert [verdict.value for verdict in Verdict] == ["verified", "failed", "unverified", "timed_out"]
    assert LABELS == {
        Verdict.VERIFIED: "TESTS VERIFIED",
        Verdict.FAILED: "TESTS FAILED",
        Verdict.UNVERIFIED: "TESTS UNVERIFIED",
        Verdict.TIMED_OUT: "TESTS TIMED OUT",
    }
    assert str(Verdict.TIMED_OUT) == "timed_out"
    assert Verdict("unverified") is Verdict.UNVERIFIED


def test_only_verified_is_green_even_though_its_label_is_inside_unverified() -> None:
    # The trap the design warns about: a substring test paints UNVERIFIED green.
    assert "VERIFIED" in Verdict.UNVERIFIED.label
    assert set(STYLES) == set(Verdict) == set(COLOURS)
    greens = [verdict for verdict in Verdict if "green" in STYLES[verdict]]
    assert greens == [Verdict.VERIFIED]
    assert len(set(COLOURS.values())) == len(Verdict)
    assert [verdict for verdict in Verdict if verdict.success] == [Verdict.VERIFIED]


def test_exit_0_with_complete_evidence_is_verified() -> None:
    judgement = judge(0, complete(), outcome())
    assert judgement.verdict is Verdict.VERIFIED
    assert judgement.reason == "all 2 tests passed"


def test_exit_0_without_evidence_is_unverified() -> None:
    judgement = judge(0, Evidence(), outcome())
    assert judgement.verdict is Verdict.UNVERIFIED
    assert "never started" in judgement.reason


def test_exit_0_after_collection_without_session_end_is_unverified() -> None:
    evidence = Evidence(started=True, collected=TESTS, outcomes={TESTS[0]: "passed", TESTS[1]: "passed"})
    assert judge(0, evidence, outcome()).reason == "pytest never finished the session (an early exit)"


def test_a_test_without_a_result_keeps_the_run_unverified() -> None:
    evidence = Evidence(started=True, collected=TESTS, outcomes={TESTS[0]: "passed"}, finished=True, exit_status=0)
    judgement = judge(0, evidence, outcome())
    assert judgement.verdict is Verdict.UNVERIFIED
    assert judgement.reason == "1 of 2 tests never reported a result (first: test_a.py::test_two)"


def test_any_problem_in_the_record_keeps_the_run_unverified() -> None:
    evidence = Evidence(**{**complete().__dict__, "problems": ("a message without this run's nonce",)})
    assert verdict_for(0, evidence, outcome()) is Verdict.UNVERIFIED


def test_a_deselected_instructor_test_keeps_the_run_unverified() -> None:
    evidence = Evidence(**{**complete().__dict__, "missing_tests": ("test_a.py::test_three",)})
    judgement = judge(0, evidence, outcome())
    assert judgement.verdict is Verdict.UNVERIFIED
    assert "test_a.py::test_three" in judgement.reason


def test_exit_status_must_match_the_session_finish() -> None:
    assert verdict_for(0, complete(exit_status=1), outcome()) is Verdict.UNVERIFIED


def test_exit_1_with_evidence_of_a_failure_is_failed() -> None:
    judgement = judge(1, complete(exit_status=1, test_two="failed"), outcome(Status.ERROR, 1))
    assert judgement.verdict is Verdict.FAILED
    assert judgement.reason == "1 of 2 tests passed (1 failed)"


def test_exit_1_with_every_test_passed_is_inconsistent() -> None:
    assert verdict_for(1, complete(exit_status=1), outcome(Status.ERROR, 1)) is Verdict.UNVERIFIED


def test_exit_0_with_a_reported_failure_is_inconsistent() -> None:
    assert verdict_for(0, complete(test_one="failed"), outcome()) is Verdict.UNVERIFIED


def test_a_skipped_test_is_not_counted_as_a_pass_and_keeps_a_green_run_green() -> None:
    # As pytest counts: a skip is no failure (a green pytest run is never `failed`), and it is no pass either.
    judgement = judge(0, complete(test_two="skipped"), outcome())
    assert judgement.verdict is Verdict.VERIFIED
    assert judgement.reason == "1 of 2 tests passed, none failed (1 skipped)"


def test_a_run_whose_every_test_was_skipped_proves_nothing() -> None:
    judgement = judge(0, complete(test_one="skipped", test_two="skipped"), outcome())
    assert judgement.verdict is Verdict.UNVERIFIED


@pytest.mark.parametrize("code", [2, 3, 4, 5, 6, 7, None])
def test_other_exit_codes_are_unverified_even_with_evidence(code: int | None) -> None:
    status = Status.ERROR if code else Status.CRASHED
    judgement = judge(code, complete(exit_status=code or 0), outcome(status, code))
    assert judgement.verdict is Verdict.UNVERIFIED


def test_a_collection_error_is_named_in_the_reason() -> None:
    evidence = Evidence(started=True, collect_errors=("test_a.py: E   ModuleNotFoundError: No module named 'fib'",))
    judgement = judge(2, evidence, outcome(Status.ERROR, 2))
    assert judgement.reason == (
        "pytest exit 2 (test run interrupted or a collection error): "
        "test_a.py: E   ModuleNotFoundError: No module named 'fib'"
    )


def test_the_wall_deadline_is_timed_out_and_names_the_running_test() -> None:
    evidence = Evidence(started=True, collected=TESTS, outcomes={TESTS[0]: "passed"}, running=TESTS[1])
    judgement = judge(None, evidence, outcome(Status.TIMED_OUT, None, signal="SIGKILL", limits={"wall_time": 5.0}))
    assert judgement.verdict is Verdict.TIMED_OUT
    assert judgement.reason == "wall time limit of 5 s reached while running test_a.py::test_two"


@pytest.mark.parametrize(
    "status", [Status.CPU_LIMIT, Status.MEMORY_LIMIT, Status.OUTPUT_LIMIT, Status.CRASHED, Status.INTERRUPTED]
)
def test_a_run_the_sandbox_stopped_is_unverified_whatever_the_evidence(status: Status) -> None:
    judgement = judge(0, complete(), outcome(status, 0))
    assert judgement.verdict is Verdict.UNVERIFIED
    assert judgement.reason.startswith(f"the test run ended with status {status.value}")


def test_docs_verdict_table_has_every_verdict_with_its_label() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "verdicts.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("|")][2:]
    cells = [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]
    assert [(row[0], row[1]) for row in cells] == [(verdict.value, verdict.label) for verdict in Verdict]
