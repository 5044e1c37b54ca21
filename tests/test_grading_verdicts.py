"""Real grading runs of honest and hostile submissions: each gets its exact verdict, and nothing is left behind.

Threats covered: a wrong answer, a missing module, a crash at import, a hang,
a daemon that outlives its run, an early ``os._exit(0)``, the submission's own
conftest.py / pytest.ini / tox.ini / setup.cfg, a forged message on the
grader's channel, overwritten instructor files and planted report files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.results import SubmissionResult
from cellbox.grading.submissions import Submission
from cellbox.grading.task import (
    GradeSettings,
    StopSwitch,
    Suite,
    base_library_is_read_only,
    file_digests,
    grade_safely,
)
from cellbox.grading.venvs import BaseLibrary
from cellbox.isolation import Isolation, make_plan, probe
from cellbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import CASES, DAEMON_MARKER, INSTRUCTOR_TOTAL, write_cases, write_suite
from sandboxkit import survivors

LIMITS = Limits(wall_time=6, cpu_time=10, memory=1024**3)


def task_dirs(root: Path) -> list[Path]:
    return sorted(root.iterdir())


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Suite]:
    root = tmp_path_factory.mktemp("grading")
    write_cases(root / "submissions")
    (root / "tasks").mkdir()
    return root / "submissions", Suite.find(write_suite(root / "tests"))


def tasks(cases: tuple[Path, Suite]) -> Path:
    """Where this module's task directories are made; empty between gradings."""
    return cases[0].parent / "tasks"


def grade(name: str, cases: tuple[Path, Suite], base: BaseLibrary, mode: str = "auto"):  # type: ignore[no-untyped-def]
    return grade_with(name, cases, base, Isolation(mode=mode))


def grade_with(name: str, cases: tuple[Path, Suite], base: BaseLibrary, isolation: Isolation):  # type: ignore[no-untyped-def]
    folder, suite = cases
    submission = Submission(id=name, path=str(folder / name), kind="folder")
    settings = GradeSettings(limits=LIMITS, task_root=str(tasks(cases)), isolation=isolation)
    return grade_safely(submission, suite, settings, base)


# The fs layer without the user layer: a read-only view, but (as root) a child with its capabilities.
FS_ONLY = Isolation(mode="strict", layers=("fs",))


# With every namespace layer this machine has (the default), and with rlimits only:
# the verdict does not depend on the isolation layers.
@pytest.mark.parametrize("mode", ["auto", "none"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_submission_gets_its_exact_verdict_and_leaves_nothing(
    name: str, mode: str, cases: tuple[Path, Suite], base: BaseLibrary
) -> None:
    result = grade(name, cases, base, mode)
    assert result.verdict is Verdict(CASES[name][1]), result.reason
    assert task_dirs(tasks(cases)) == []
    assert survivors(DAEMON_MARKER) == []


def test_honest_submission_reports_every_test_passed(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("honest", cases, base)
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


def test_buggy_submission_names_the_failing_assertions(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("buggy", cases, base)
    outcomes = {test.nodeid: test.outcome for test in result.tests}
    assert outcomes["test_fib.py::test_base_cases"] == "passed"
    assert outcomes["test_fib.py::test_ten"] == "failed"
    assert "assert 10 == 55" in next(t.message for t in result.tests if t.nodeid == "test_fib.py::test_ten")
    assert (result.passed, result.failed, result.total, result.score) == (1, 4, 5, 20.0)


def test_missing_module_is_unverified_with_the_import_error(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("missing", cases, base)
    assert result.reason == (
        "pytest exit 2 (test run interrupted or a collection error): "
        "test_fib.py: ModuleNotFoundError: No module named 'fib'"
    )
    assert result.run is not None and result.run["exit_code"] == 2


def test_hanging_submission_names_the_test_that_was_running(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("hanging", cases, base)
    assert result.verdict is Verdict.TIMED_OUT
    assert result.running == "test_fib.py::test_ten"
    assert result.reason == "wall time limit of 6 s reached while running test_fib.py::test_ten"
    assert result.score == 0.0


def test_daemon_started_at_import_is_killed_with_the_run(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("daemon", cases, base)
    assert result.run is not None and result.run["killed_processes"] >= 1
    assert survivors(DAEMON_MARKER) == []


def test_early_exit_at_import_is_unverified_not_verified(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("early_exit", cases, base)
    assert result.run is not None and result.run["exit_code"] == 0
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason == "pytest never finished collecting the tests"


def test_killing_pytest_is_unverified_with_the_signal(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("kills_pytest", cases, base)
    assert result.reason == "the test run ended with status crashed (SIGKILL)"
    assert result.running == "test_fib.py::test_base_cases"


def test_a_skip_from_the_submission_is_not_a_pass(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("skips_tests", cases, base)
    assert result.reason == "0 of 5 tests passed (5 skipped)"
    assert result.score == 0.0


def test_own_conftest_and_ini_change_nothing(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("own_config", cases, base)
    assert result.verdict is Verdict.FAILED
    assert (result.passed, result.failed) == (1, 4)


def test_forged_channel_message_is_caught(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    result = grade("forged_channel", cases, base)
    assert result.reason == "the test record is inconsistent: a message without this run's nonce arrived on the channel"


def test_overwritten_instructor_files_are_never_verified(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    # Without namespaces the overwrite succeeds and the record shows it.
    result = grade("forged_files", cases, base, "none")
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("the test record is inconsistent: test_more.py::test_fake")


def test_instructor_files_are_read_only_to_an_isolated_run(cases: tuple[Path, Suite], base: BaseLibrary) -> None:
    if not {"fs", "landlock"} & set(make_plan(Isolation(mode="auto"), probe(), user=None).layers):
        pytest.skip("neither the fs layer (bubblewrap) nor Landlock is available here; see `cellbox doctor`")
    result = grade("forged_files", cases, base, "auto")
    assert result.verdict is Verdict.UNVERIFIED
    assert "Read-only file system" in result.reason or "Permission denied" in result.reason


@pytest.mark.parametrize(
    "isolation", [Isolation(mode="auto"), Isolation(mode="none"), FS_ONLY], ids=["auto", "none", "fs-only"]
)
def test_submission_cannot_change_the_base_library_the_others_are_graded_with(
    isolation: Isolation, cases: tuple[Path, Suite], base: BaseLibrary
) -> None:
    plan = make_plan(isolation, probe(), user=None)
    if isolation is FS_ONLY and "fs" not in plan.layers:
        pytest.skip("the fs layer (bubblewrap) is not available here; see `cellbox doctor`")
    # Shared only with a run as another user: a read-only view alone can be remounted by a root child.
    assert base_library_is_read_only(isolation) is (plan.user is not None)
    before = file_digests(base.path)
    assert grade_with("patches_pytest", cases, base, isolation).verdict is Verdict.FAILED
    assert file_digests(base.path) == before
    assert grade_with("honest", cases, base, isolation).verdict is Verdict.VERIFIED


def test_grader_failure_becomes_that_submissions_unverified_row(cases: tuple[Path, Suite]) -> None:
    broken = BaseLibrary.build()
    broken.remove()  # the grader's own files are gone: copying them fails
    result = grade("honest", cases, broken)
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("grader error: FileNotFoundError")
    assert task_dirs(tasks(cases)) == []


def test_stop_switch_kills_a_hanging_run_instead_of_waiting_for_the_deadline(
    cases: tuple[Path, Suite], base: BaseLibrary
) -> None:
    # What Ctrl-C does while grading: every run in progress is killed, so the row says interrupted,
    # where waiting for the 60 s deadline would have said timed_out.
    folder, suite = cases
    settings = GradeSettings(limits=Limits(wall_time=60, cpu_time=60), task_root=str(tasks(cases)))
    switch = StopSwitch()
    results: list[SubmissionResult] = []
    worker = threading.Thread(target=lambda: results.append(
        grade_safely(Submission(id="hanging", path=str(folder / "hanging"), kind="folder"), suite, settings, base,
                     switch)))
    worker.start()
    time.sleep(1.5)
    switch.stop()
    worker.join(timeout=120)
    [result] = results
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("the test run ended with status interrupted")
    assert task_dirs(tasks(cases)) == []
    assert survivors(DAEMON_MARKER) == []
