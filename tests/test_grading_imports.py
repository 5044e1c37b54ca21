"""Only the submission's own modules are served from it: never a library the tests expect from the grader.

The grader's Python here lacks scipy (as the documented instructor install lacks
numpy): a submission's fake ``scipy/`` whose ``allclose`` agrees with anything
must not answer the tests' ``import scipy``, at the top of a test file or inside
a test; the run is ``unverified`` with the module and the command that installs
it.  Fake ``pytest``/``_pytest`` packages and a ``conftest.py`` change nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.imports import own_modules
from cellbox.grading.submissions import discover
from cellbox.grading.task import GradeSettings, Suite, grade_safely
from cellbox.grading.venvs import BaseLibrary
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import GOOD_MEAN, MEAN_TESTS, WRONG_MEAN, write_tree

LIMITS = Limits(wall_time=30, cpu_time=30, memory=1024**3)
LIBRARY = "scipy"  # a library the tests expect from the grader's Python, which lacks it here
FAKE_LIBRARY = {f"{LIBRARY}/__init__.py": "def allclose(a, b, *args, **kwargs):\n    return True\n"}
MISSING = (
    f"the tests import {LIBRARY}, which the grader's Python lacks and the submission may not provide: "
    f"install it beside cellbox ({sys.executable} -m pip install {LIBRARY})"
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec(LIBRARY) is not None, reason=f"needs a grader's Python without {LIBRARY}"
)


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


def graded(tmp_path: Path, tests: dict[str, str], files: dict[str, str], base: BaseLibrary):  # type: ignore[no-untyped-def]
    suite = Suite.find(write_tree(tmp_path / "tests", tests))
    write_tree(tmp_path / "subs" / "student", files)
    [found] = discover(tmp_path / "subs")
    return grade_safely(found, suite, GradeSettings(limits=LIMITS), base)


def test_fake_library_in_the_submission_never_answers_the_tests_import(tmp_path: Path, base: BaseLibrary) -> None:
    tests = {
        "test_close.py": f"""
            import {LIBRARY}
            from mean import mean

            def test_three():
                assert {LIBRARY}.allclose(mean([1, 2, 3]), 2)
        """
    }
    result = graded(tmp_path, tests, {"mean.py": WRONG_MEAN, **FAKE_LIBRARY}, base)
    assert (result.verdict, result.reason) == (Verdict.UNVERIFIED, MISSING)
    assert [(test.nodeid, test.outcome) for test in result.tests] == [("test_close.py::test_three", "not run")]


def test_an_import_inside_a_test_is_refused_too(tmp_path: Path, base: BaseLibrary) -> None:
    tests = {
        "test_close.py": f"""
            from mean import mean

            def test_three():
                import {LIBRARY}
                assert {LIBRARY}.allclose(mean([1, 2, 3]), 2)

            def test_one():
                assert mean([5]) == 5
        """
    }
    result = graded(tmp_path, tests, {"mean.py": GOOD_MEAN, **FAKE_LIBRARY}, base)
    assert (result.verdict, result.reason) == (Verdict.UNVERIFIED, MISSING)
    outcomes = {test.nodeid: test.outcome for test in result.tests}
    assert outcomes == {"test_close.py::test_three": "failed", "test_close.py::test_one": "passed"}


def test_fake_pytest_and_conftest_in_the_submission_change_nothing(tmp_path: Path, base: BaseLibrary) -> None:
    agrees = (
        "def approx(value, *args, **kwargs):\n    class _Any:\n        __eq__ = lambda self, other: True\n"
        "    return _Any()\n"
    )
    files = {
        "mean.py": WRONG_MEAN,
        "pytest/__init__.py": agrees,
        "_pytest/__init__.py": agrees,
        "conftest.py": "import pytest\n\ndef pytest_runtest_makereport(item, call):\n    call.excinfo = None\n",
    }
    tests = {
        "test_approx.py": """
            import pytest
            from mean import mean

            def test_three():
                assert mean([1, 2, 3]) == pytest.approx(2)
        """,
        **MEAN_TESTS,
    }
    result = graded(tmp_path, tests, files, base)
    assert result.verdict is Verdict.FAILED, result.reason
    assert {test.outcome for test in result.tests} == {"failed"}


def test_own_modules_leave_out_libraries_pytest_and_requirements() -> None:
    offered = ["mean", "numpy", "scipy", "pytest", "_pytest", "conftest", "helpers", "attr", "mylib"]
    assert own_modules(offered, requirements=["mylib>=1.0"]) == ["helpers", "mean"]
    # The instructor's --modules names them exactly.
    assert own_modules(offered, named=["mean", "numpy"]) == ["mean", "numpy"]
