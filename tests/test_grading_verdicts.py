"""Real grading runs of honest and hostile submissions: each gets its exact verdict, and nothing is left behind.

Threats covered: a wrong answer, a missing module, a crash or exit at import,
a hang, a daemon that outlives its run, an early ``os._exit(0)``, a process
that kills itself, the submission's own conftest.py / pytest.ini / tox.ini /
setup.cfg, a forged record on every descriptor it has, a patched
``TestReport``, an ``__eq__`` that is always true, a student's ``json.py`` and
``random.py``, overwritten instructor files, and a changed worker library.
The submission's code never runs in the process that holds pytest and the
reporter, so none of them reaches the evidence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cellbox.grading.results import SubmissionResult
from cellbox.grading.submissions import Submission
from cellbox.grading.task import GradeSettings, StopSwitch, Suite, file_digests, grade_safely
from cellbox.grading.venvs import BaseLibrary
from cellbox.sandbox.isolation import Isolation, make_plan, probe
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import (
    CASES,
    DAEMON_MARKER,
    FORGE_FILES,
    INSTRUCTOR_TOTAL,
    MEAN_CASES,
    MEAN_TESTS,
    write_cases,
    write_suite,
    write_tree,
)
from sandboxkit import survivors

# About seventy grading runs, each a sandboxed pytest: heavy, left to CI and -m slow.
pytestmark = pytest.mark.slow

# The hanging submission waits out a 6 s wall limit; for every other one the wall limit is only a guard, far past
# what a sandboxed pytest needs on a busy machine (with 6 s for all, six tests failed at a load of 17).
LIMITS = Limits(wall_time=6, cpu_time=10, memory=1024**3)
GUARD_LIMITS = Limits(wall_time=60, cpu_time=10, memory=1024**3)
HANGS = "hanging"
Cases = tuple[Path, Suite]


def task_dirs(root: Path) -> list[Path]:
    return sorted(root.iterdir())


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Cases:
    root = tmp_path_factory.mktemp("grading")
    write_cases(root / "submissions")
    write_tree(root / "submissions" / "forged_files", FORGE_FILES)
    (root / "tasks").mkdir()
    return root / "submissions", Suite.find(write_suite(root / "tests"))


@pytest.fixture(scope="module")
def mean_cases(tmp_path_factory: pytest.TempPathFactory) -> Cases:
    root = tmp_path_factory.mktemp("mean")
    write_cases(root / "submissions", cases=MEAN_CASES)
    (root / "tasks").mkdir()
    return root / "submissions", Suite.find(write_tree(root / "tests", MEAN_TESTS))


def tasks(cases: Cases) -> Path:
    """Where this module's task directories are made; empty between gradings."""
    return cases[0].parent / "tasks"


def grade(name: str, cases: Cases, base: BaseLibrary, mode: str = "auto") -> SubmissionResult:
    return grade_with(name, cases, base, Isolation(mode=mode))


Graded = Callable[[str, Cases, str], SubmissionResult]


@pytest.fixture(scope="module")
def graded(base: BaseLibrary) -> Graded:
    """``graded(name, cases, mode)``: the result of grading submission ``name`` once in this module.

    A grading changes nothing the next one sees (its task directory is removed, the worker library is
    checked unchanged), so the tests that only read one submission's result share one grading run
    (the hanging one waits out its 6 s limit once, not three times).
    """
    results: dict[tuple[str, str, str], SubmissionResult] = {}

    def graded(name: str, cases: Cases, mode: str = "auto") -> SubmissionResult:
        key = (str(cases[0]), name, mode)
        if key not in results:
            results[key] = grade(name, cases, base, mode)
        return results[key]

    return graded


def grade_with(name: str, cases: Cases, base: BaseLibrary, isolation: Isolation) -> SubmissionResult:
    folder, suite = cases
    submission = Submission(id=name, path=str(folder / name), kind="folder")
    limits = LIMITS if name == HANGS else GUARD_LIMITS
    settings = GradeSettings(limits=limits, task_root=str(tasks(cases)), isolation=isolation)
    return grade_safely(submission, suite, settings, base)


# With every namespace layer this machine has (the default), and with rlimits only:
# the verdict does not depend on the isolation layers.
@pytest.mark.parametrize("mode", ["auto", "none"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_submission_gets_its_exact_verdict_and_leaves_nothing(
    name: str, mode: str, cases: Cases, graded: Graded
) -> None:
    result = graded(name, cases, mode)
    assert result.verdict is Verdict(CASES[name][1]), result.reason
    assert task_dirs(tasks(cases)) == []
    assert survivors(DAEMON_MARKER) == []


@pytest.mark.parametrize("mode", ["auto", "none"])
@pytest.mark.parametrize("name", sorted(MEAN_CASES))
def test_the_issues_submissions_get_their_exact_verdicts(
    name: str, mode: str, mean_cases: Cases, graded: Graded
) -> None:
    result = graded(name, mean_cases, mode)
    assert result.verdict is Verdict(MEAN_CASES[name][1]), result.reason
    assert task_dirs(tasks(mean_cases)) == []


def test_honest_submission_reports_every_test_passed(cases: Cases, graded: Graded) -> None:
    result = graded("honest", cases)
    assert result.reason == f"all {INSTRUCTOR_TOTAL} tests passed"
    assert [test.outcome for test in result.tests] == ["passed"] * INSTRUCTOR_TOTAL
    assert {test.nodeid for test in result.tests} == {
        "test_fib.py::test_base_cases",
        "test_fib.py::test_ten",
        "test_more.py::test_small[2-1]",
        "test_more.py::test_small[3-2]",
        "test_more.py::test_small[7-13]",
    }
    assert result.score == 100.0
    assert result.run is not None and result.run["status"] == "ok" and result.run["exit_code"] == 0
    # One submission process, with the grading isolation (not the trusted process's).
    [run] = result.submission_runs
    assert run is not None and run["isolation"] == result.submission_runs[0]["isolation"]


def test_buggy_submission_names_the_failing_assertions(cases: Cases, graded: Graded) -> None:
    result = graded("buggy", cases)
    outcomes = {test.nodeid: test.outcome for test in result.tests}
    assert outcomes["test_fib.py::test_base_cases"] == "passed"
    assert outcomes["test_fib.py::test_ten"] == "failed"
    message = next(t.message for t in result.tests if t.nodeid == "test_fib.py::test_ten")
    assert "assert 10 == 55" in message
    # Paths are relative to the tests' folder, never the grader's temporary one.
    assert "test_fib.py:" in message and "/tmp" not in message and "cellbox-grade" not in message
    assert (result.passed, result.failed, result.total, result.score) == (1, 4, 5, 20.0)


def test_missing_module_is_unverified_with_the_import_error(cases: Cases, graded: Graded) -> None:
    result = graded("missing", cases)
    assert result.reason == (
        "pytest exit 2 (test run interrupted or a collection error): "
        "test_fib.py: ModuleNotFoundError: No module named 'fib'"
    )
    assert result.run is not None and result.run["exit_code"] == 2


def test_exception_at_import_is_named_with_the_students_traceback(cases: Cases, graded: Graded) -> None:
    result = graded("broken_import", cases)
    assert result.reason.endswith(
        "test_fib.py: cellbox.grading.bridge.SubmissionImportError: "
        "RuntimeError at the import of the submission's module fib: broken at import"
    ), result.reason


def test_system_exit_at_import_is_named_as_such(mean_cases: Cases, graded: Graded) -> None:
    result = graded("exits_at_import", mean_cases)
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.endswith("SystemExit(0) at the import of the submission's module mean"), result.reason


def test_hanging_submission_names_the_test_that_was_running(cases: Cases, graded: Graded) -> None:
    result = graded("hanging", cases)
    assert result.verdict is Verdict.TIMED_OUT
    assert result.running == "test_fib.py::test_ten"
    assert result.reason == "wall time limit of 6 s reached while running test_fib.py::test_ten"
    assert result.score == 0.0


def test_daemon_started_at_import_is_killed_with_the_submissions_process(cases: Cases, graded: Graded) -> None:
    result = graded("daemon", cases)
    [run] = result.submission_runs
    assert run is not None and run["killed_processes"] >= 1
    assert survivors(DAEMON_MARKER) == []


def test_early_exit_at_import_is_unverified_not_verified(cases: Cases, graded: Graded) -> None:
    result = graded("early_exit", cases)
    assert result.verdict is Verdict.UNVERIFIED
    assert "the submission's process ended (exit status 0) during the import of fib" in result.reason


def test_a_process_that_kills_itself_fails_each_test_and_the_next_gets_a_new_one(cases: Cases, graded: Graded) -> None:
    result = graded("kills_its_process", cases)
    assert result.reason == "0 of 5 tests passed (5 failed)"
    assert all("SIGKILL" in test.message for test in result.tests), [t.message for t in result.tests]
    assert len(result.submission_runs) == 5


def test_a_skip_from_the_submission_is_not_a_skip(cases: Cases, graded: Graded) -> None:
    result = graded("skips_tests", cases)
    assert result.reason == "0 of 5 tests passed (5 failed)"
    assert "SkipTest: not today" in result.tests[0].message
    assert result.score == 0.0


def test_system_exit_in_a_call_fails_that_test(cases: Cases, graded: Graded) -> None:
    result = graded("exits_in_test", cases)
    assert "SystemExit(0) raised by the submission in fib.fib(...)" in result.tests[0].message


def test_own_conftest_and_ini_change_nothing(cases: Cases, graded: Graded) -> None:
    result = graded("own_config", cases)
    assert result.verdict is Verdict.FAILED
    assert (result.passed, result.failed) == (1, 4)


def test_forged_record_on_every_descriptor_reaches_nothing(mean_cases: Cases, graded: Graded) -> None:
    result = graded("forges_reporter", mean_cases)
    assert result.verdict is Verdict.UNVERIFIED
    assert "the submission's process ended (exit status 0) during the import of mean" in result.reason
    assert result.tests == [] or all(test.outcome != "passed" for test in result.tests)


def test_eq_always_true_is_not_equal_to_the_expected_value(mean_cases: Cases, graded: Graded) -> None:
    result = graded("eq_always_true", mean_cases)
    assert result.reason == "0 of 2 tests passed (2 failed)"
    assert "<submission Anything object" in result.tests[0].message or "Anything" in result.tests[0].message


def test_overwritten_instructor_files_are_never_verified(cases: Cases, graded: Graded) -> None:
    # Without namespaces (and as root) the submission finds the grader's copy beside its task and overwrites it:
    # the before-and-after hashes show it.
    result = graded("forged_files", cases, "none")
    assert result.verdict in (Verdict.UNVERIFIED, Verdict.FAILED)
    if result.verdict is Verdict.UNVERIFIED:
        assert result.reason.startswith("the test record is inconsistent: "), result.reason


def test_instructor_files_are_out_of_sight_of_an_isolated_submission(cases: Cases, graded: Graded) -> None:
    if "fs" not in make_plan(Isolation(mode="auto"), probe(), user=None).layers:
        pytest.skip("the fs layer (bubblewrap) is not available here; see `cellbox doctor`")
    result = graded("forged_files", cases, "auto")
    assert result.verdict is Verdict.FAILED
    assert (result.passed, result.failed) == (1, 4)


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_submission_cannot_change_the_worker_library_the_others_are_graded_with(
    mode: str, cases: Cases, base: BaseLibrary
) -> None:
    before = file_digests(base.path)
    assert grade("patches_worker", cases, base, mode).verdict is Verdict.FAILED
    assert file_digests(base.path) == before
    assert grade("honest", cases, base, mode).verdict is Verdict.VERIFIED


def test_grader_failure_becomes_that_submissions_unverified_row(cases: Cases) -> None:
    broken = BaseLibrary.build()
    broken.remove()  # the grader's own files are gone: copying them fails
    result = grade("honest", cases, broken)
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("grader error: FileNotFoundError")
    assert task_dirs(tasks(cases)) == []


def test_stop_switch_kills_a_hanging_run_instead_of_waiting_for_the_deadline(cases: Cases, base: BaseLibrary) -> None:
    # What Ctrl-C does while grading: every run in progress is killed, so the row says interrupted,
    # where waiting for the 60 s deadline would have said timed_out.
    folder, suite = cases
    settings = GradeSettings(limits=Limits(wall_time=60, cpu_time=60), task_root=str(tasks(cases)))
    switch = StopSwitch()
    results: list[SubmissionResult] = []
    worker = threading.Thread(
        target=lambda: results.append(
            grade_safely(
                Submission(id="hanging", path=str(folder / "hanging"), kind="folder"), suite, settings, base, switch
            )
        )
    )
    worker.start()
    time.sleep(2.5)
    switch.stop()
    worker.join(timeout=120)
    [result] = results
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("the test run ended with status interrupted")
    assert task_dirs(tasks(cases)) == []
    assert survivors(DAEMON_MARKER) == []
