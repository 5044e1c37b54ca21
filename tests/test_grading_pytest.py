"""The grader against plain pytest on the same files: each test's outcome, the exit status and the verdict agree.

Plain pytest runs in a subprocess with the submission's folder on ``PYTHONPATH``
(as an instructor tries the tests on a solution); ``cellbox grade``'s code runs
the same tests through its boundary.  pytest's ``-v`` lines name each report
(``PASSED``, ``XFAIL``, ``XPASS``, ``SKIPPED``, ``FAILED``, ``ERROR``); a test
that passes and errors in teardown has two of them, and the grader counts it
once, as ``error``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.submissions import discover
from cellbox.grading.task import GradeSettings, Suite, grade_safely
from cellbox.grading.venvs import BaseLibrary
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import GOOD_MEAN, write_tree

LIMITS = Limits(wall_time=30, cpu_time=30, memory=1024**3)

# pytest's -v words of one test -> the grader's one outcome for it.
PYTEST_WORDS = {
    ("PASSED",): "passed",
    ("FAILED",): "failed",
    ("ERROR",): "error",
    ("PASSED", "ERROR"): "error",
    ("SKIPPED",): "skipped",
    ("XFAIL",): "xfailed",
    ("XPASS",): "xpassed",
}

# pytest is green on these: 2 passed, 1 xfailed, 1 xpassed, 1 skipped (the case is the first three).
GREEN_TESTS = {
    "test_green.py": """
        import pytest
        from mean import mean

        def test_three():
            assert mean([1, 2, 3]) == 2

        def test_one():
            assert mean([5]) == 5

        @pytest.mark.xfail(reason="the empty list is not defined yet")
        def test_empty():
            assert mean([]) == 0

        @pytest.mark.xfail(reason="may pass")
        def test_may_pass():
            assert mean([2, 4]) == 3

        @pytest.mark.skip(reason="not this term")
        def test_later():
            assert mean([1]) == 1
    """,
}

# pytest is red on these: a strict xpass, a fixture failing in setup, one failing in teardown, a failure.
RED_TESTS = {
    "test_red.py": """
        import pytest
        from mean import mean

        @pytest.fixture
        def broken_setup():
            raise RuntimeError("no data")

        @pytest.fixture
        def broken_teardown():
            yield [1, 2, 3]
            raise RuntimeError("cleanup failed")

        def test_passes():
            assert mean([1, 2, 3]) == 2

        @pytest.mark.xfail(strict=True, reason="must fail")
        def test_strict_xpass():
            assert mean([4]) == 4

        def test_setup_error(broken_setup):
            assert mean(broken_setup) == 2

        def test_teardown_error(broken_teardown):
            assert mean(broken_teardown) == 2

        def test_fails():
            assert mean([1, 3]) == 3
    """,
}


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


def plain_pytest(tests: Path, submission: Path) -> tuple[int, dict[str, str]]:
    """Run plain pytest on ``tests`` with ``submission`` importable; its exit status and each test's outcome."""
    env = {**os.environ, "PYTHONPATH": str(submission), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--color=no", str(tests)],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    words: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if found:
            words.setdefault(found.group(1), []).append(found.group(2))
    return done.returncode, {nodeid: PYTEST_WORDS[tuple(seen)] for nodeid, seen in words.items()}


def graded(tmp_path: Path, tests: dict[str, str], submission: dict[str, str], base: BaseLibrary):  # type: ignore[no-untyped-def]
    suite = Suite.find(write_tree(tmp_path / "tests", tests))
    write_tree(tmp_path / "subs" / "student", submission)
    [found] = discover(tmp_path / "subs")
    return grade_safely(found, suite, GradeSettings(limits=LIMITS), base)


def test_green_pytest_run_with_xfail_xpass_and_skip_is_verified_as_pytest_counts(
    tmp_path: Path, base: BaseLibrary
) -> None:
    result = graded(tmp_path, GREEN_TESTS, {"mean.py": GOOD_MEAN}, base)
    status, outcomes = plain_pytest(tmp_path / "tests", tmp_path / "subs" / "student")
    assert status == 0
    assert (
        {test.nodeid: test.outcome for test in result.tests}
        == outcomes
        == {
            "test_green.py::test_three": "passed",
            "test_green.py::test_one": "passed",
            "test_green.py::test_empty": "xfailed",
            "test_green.py::test_may_pass": "xpassed",
            "test_green.py::test_later": "skipped",
        }
    )
    assert result.verdict is Verdict.VERIFIED, result.reason
    row = result.to_json()
    counts = {key: row[key] for key in ("passed", "failed", "errors", "skipped", "not_run", "total", "score")}
    # 3 passes (an xpass among them) over the 3 scored tests: the skip and the xfail are not scored.
    assert counts == {"passed": 3, "failed": 0, "errors": 0, "skipped": 2, "not_run": 0, "total": 5, "score": 100.0}


def test_red_pytest_run_with_strict_xpass_and_fixture_errors_is_failed_each_test_once(
    tmp_path: Path, base: BaseLibrary
) -> None:
    result = graded(tmp_path, RED_TESTS, {"mean.py": GOOD_MEAN}, base)
    status, outcomes = plain_pytest(tmp_path / "tests", tmp_path / "subs" / "student")
    assert status == 1
    assert (
        {test.nodeid: test.outcome for test in result.tests}
        == outcomes
        == {
            "test_red.py::test_passes": "passed",
            "test_red.py::test_strict_xpass": "failed",
            "test_red.py::test_setup_error": "error",
            "test_red.py::test_teardown_error": "error",
            "test_red.py::test_fails": "failed",
        }
    )
    assert result.verdict is Verdict.FAILED, result.reason
    row = result.to_json()
    counts = {key: row[key] for key in ("passed", "failed", "errors", "skipped", "not_run", "total", "score")}
    assert counts == {"passed": 1, "failed": 2, "errors": 2, "skipped": 0, "not_run": 0, "total": 5, "score": 20.0}


def test_a_run_that_never_started_counts_every_instructor_test_once_as_not_run(
    tmp_path: Path, base: BaseLibrary
) -> None:
    # The faker: its import fails, so nothing is collected; the file still has its five tests.
    result = graded(tmp_path, GREEN_TESTS, {"mean.py": "import sys\nsys.exit(0)\n"}, base)
    assert result.verdict is Verdict.UNVERIFIED
    row = result.to_json()
    assert (row["passed"], row["not_run"], row["errors"], row["total"], row["score"]) == (0, 5, 0, 5, 0.0)


def notebook(cells: list[str]) -> str:
    return json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [
                {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
                for source in cells
            ],
        }
    )


# The work sits under the guard, as a kernel runs it; the builtins counter shows how often the cells ran.
GUARDED_CELLS = [
    "import builtins\nbuiltins.CELL_RUNS = getattr(builtins, 'CELL_RUNS', 0) + 1\n",
    "def runs():\n    import builtins\n    return builtins.CELL_RUNS\n",
    'if __name__ == "__main__":\n    def mean(xs):\n        return sum(xs) / len(xs)\n    LAST = mean([1, 2, 3])\n',
]
GUARDED_TESTS = {
    "test_guarded.py": """
        import submission
        import homework

        def test_mean():
            assert submission.mean([1, 2, 3]) == 2

        def test_work_under_the_guard_ran():
            assert homework.LAST == 2

        def test_cells_ran_once():
            assert submission.runs() == 1 and homework is submission
    """,
}


def test_notebook_runs_as_main_once_as_pytest_on_its_script_run_as_main(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_tree(tmp_path / "tests", GUARDED_TESTS))
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "homework.ipynb").write_text(notebook(GUARDED_CELLS))
    [found] = discover(tmp_path / "subs")
    result = grade_safely(found, suite, GradeSettings(limits=LIMITS), base)
    # Plain pytest on the same cells, run the way a kernel runs them: one module named __main__.
    script = write_tree(
        tmp_path / "plain",
        {
            "homework.py": "import runpy, sys, types\n"
            "_main = types.ModuleType('__main__')\n"
            "_main.__dict__.update(runpy.run_path(__file__.replace('homework.py', 'cells.txt'), run_name='__main__'))\n"
            "sys.modules['homework'] = sys.modules['submission'] = _main\n",
            "submission.py": "import homework, sys\nsys.modules['submission'] = homework\n",
            "cells.txt": "\n".join(GUARDED_CELLS),
        },
    )
    status, outcomes = plain_pytest(tmp_path / "tests", script)
    assert status == 0 and set(outcomes.values()) == {"passed"}
    assert {test.nodeid: test.outcome for test in result.tests} == outcomes
    assert result.verdict is Verdict.VERIFIED, result.reason
