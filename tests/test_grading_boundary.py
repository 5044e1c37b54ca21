"""What an instructor's test can do across the boundary, in real grading runs (docs/grading.md: "Across the boundary").

The submission's code runs in its own sandboxed process; the tests get
stand-ins.  Each behaviour the documentation's table promises is an instructor test
below, run by ``cellbox grade``'s own machinery against a real submission, and
each must pass: exceptions (built-in and the student's own), ``isinstance``
with the student's classes, identity, in-place changes (``new``/``value_of``),
printing, iteration, module state, and what never crosses.  Also: a
``timeout`` marker (or the default ``--test-timeout``) ends one call and the
other tests still count; pytest collects ``unittest.TestCase`` classes and
ignores fixtures named ``test_*``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.results import SubmissionResult
from cellbox.grading.submissions import Submission
from cellbox.grading.task import GradeSettings, Suite, grade_safely
from cellbox.grading.venvs import BaseLibrary
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import GOOD_FIB, SPINNING_MEAN, TIMEOUT_TESTS, write_tree

LIMITS = Limits(wall_time=30, cpu_time=20, memory=1024**3)

SHAPES = """
from collections import OrderedDict, namedtuple


class Overdrawn(ValueError):
    pass


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def norm2(self):
        return self.x ** 2 + self.y ** 2

    def __repr__(self):
        return f"Point({self.x}, {self.y})"

    def __len__(self):
        return 2

    def __iter__(self):
        return iter((self.x, self.y))

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class Liar(int):
    def __eq__(self, other):
        return True


Pair = namedtuple("Pair", "a b")
CACHE = {}


def make_point(x, y):
    return Point(x, y)


def same(obj):
    return obj


def withdraw(balance, amount):
    if amount > balance:
        raise Overdrawn(f"only {balance}")
    return balance - amount


def parse(text):
    return int(text)


def sort_in_place(items):
    items.sort()


def liar():
    return Liar(3)


def pair():
    return Pair(1, 2)


def ordered():
    return OrderedDict(a=1)


def greet(name):
    print(f"hello {name}")


def countdown(n):
    while n:
        yield n
        n -= 1


def remember(key, value):
    CACHE[key] = value


def keyed_by_point():
    return {Point(0, 0): 1}


def recursive():
    items = [1]
    items.append(items)
    return items


def lookup(key):
    return {"a": 1}[key]


def surrogate():
    return "caf\\udce9"


def factorial(n):
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result
"""

BOUNDARY_TESTS = {
    "test_boundary.py": """
        import pytest

        import shapes
        from cellbox.grading.bridge import RemoteObject, new, value_of
        from shapes import Overdrawn, Point, make_point


        def test_a_builtin_exception_is_raised_as_itself():
            with pytest.raises(ValueError, match="invalid literal"):
                shapes.parse("x")
            with pytest.raises(KeyError) as info:
                shapes.lookup("b")
            assert info.value.args == ("b",)


        def test_the_students_exception_class_is_caught_by_name_and_by_base():
            with pytest.raises(Overdrawn, match="only 5"):
                shapes.withdraw(5, 10)
            with pytest.raises(ValueError):
                shapes.withdraw(5, 10)


        def test_isinstance_attributes_and_methods_of_the_students_objects():
            point = make_point(3, 4)
            assert isinstance(point, Point) and not isinstance(3, Point)
            assert point.x == 3 and point.norm2() == 25


        def test_the_same_object_comes_back_as_the_same_stand_in():
            point = make_point(1, 2)
            assert shapes.same(point) is point


        def test_an_argument_is_a_copy():
            items = [3, 1, 2]
            shapes.sort_in_place(items)
            assert items == [3, 1, 2]


        def test_an_object_made_in_the_submission_shows_in_place_changes():
            items = new([3, 1, 2])
            shapes.sort_in_place(items)
            assert value_of(items) == [1, 2, 3]


        def test_a_subclass_of_a_builtin_crosses_as_its_builtin_value():
            value = shapes.liar()
            assert type(value) is int and value == 3 and value != 4
            assert shapes.pair() == (1, 2) and type(shapes.pair()) is tuple
            assert type(shapes.ordered()) is dict


        def test_the_students_eq_is_never_asked():
            point = make_point(1, 2)
            assert point != (1, 2) and point != make_point(1, 2) and point == point


        def test_printing_reaches_capsys(capsys):
            shapes.greet("ada")
            assert capsys.readouterr().out == "hello ada\\n"


        def test_generators_len_iteration_repr_and_setattr():
            assert list(shapes.countdown(3)) == [3, 2, 1]
            point = make_point(1, 2)
            assert len(point) == 2 and list(point) == [1, 2] and repr(point) == "Point(1, 2)"
            point.x = 5
            assert point.norm2() == 29


        def test_module_state_is_read_when_used():
            shapes.remember("a", 1)
            assert shapes.CACHE == {"a": 1}


        def test_what_is_not_plain_data_stays_an_object():
            keyed = shapes.keyed_by_point()
            assert isinstance(keyed, RemoteObject) and len(keyed) == 1
            items = shapes.recursive()
            assert items[0] == 1 and isinstance(items[1], RemoteObject)


        def test_a_large_int_crosses_whole():
            import math

            assert shapes.factorial(2000) == math.factorial(2000)  # 5736 digits


        def test_a_value_that_cannot_be_sent_fails_that_call_only():
            from cellbox.grading.bridge import ProtocolError

            with pytest.raises(ProtocolError, match="could not be sent"):
                shapes.surrogate()
            assert shapes.parse("3") == 3


        def test_a_function_of_the_tests_cannot_be_given_to_the_submission():
            with pytest.raises(TypeError, match="cannot be given to the submission"):
                shapes.same(lambda: 1)
    """,
}

UNITTEST_TESTS = {
    "test_unittest.py": """
        import unittest

        from fib import fib


        class FibChecks(unittest.TestCase):
            def test_ten(self):
                self.assertEqual(fib(10), 55)

            def test_negative_is_zero(self):
                self.assertEqual(fib(-1), 0)
    """,
    "test_fixture_named_test.py": """
        import pytest

        import fib


        @pytest.fixture
        def test_cases():
            return [(0, 0), (1, 1), (10, 55)]


        def test_fib_values(test_cases):
            for n, expected in test_cases:
                assert fib.fib(n) == expected
    """,
}


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


def grade(
    tmp_path: Path, tests: dict[str, str], files: dict[str, str], base: BaseLibrary, test_timeout: float | None = None
) -> SubmissionResult:
    suite = Suite.find(write_tree(tmp_path / "tests", tests))
    folder = write_tree(tmp_path / "subs" / "alice", files)
    (tmp_path / "tasks").mkdir()
    settings = GradeSettings(limits=LIMITS, task_root=str(tmp_path / "tasks"), test_timeout=test_timeout)
    result = grade_safely(Submission(id="alice", path=str(folder), kind="folder"), suite, settings, base)
    assert list((tmp_path / "tasks").iterdir()) == []
    return result


def test_every_promise_of_the_boundary_holds_in_a_real_run(tmp_path: Path, base: BaseLibrary) -> None:
    result = grade(tmp_path, BOUNDARY_TESTS, {"shapes.py": SHAPES}, base)
    failing = {test.nodeid: test.message for test in result.tests if test.outcome != "passed"}
    assert failing == {}
    assert result.verdict is Verdict.VERIFIED, result.reason
    assert result.total == 15


def test_timeout_marker_fails_one_test_and_the_others_count(tmp_path: Path, base: BaseLibrary) -> None:
    result = grade(tmp_path, TIMEOUT_TESTS, {"mean.py": SPINNING_MEAN}, base)
    assert result.verdict is Verdict.FAILED, result.reason
    outcomes = {test.nodeid: test.outcome for test in result.tests}
    assert outcomes == {
        "test_timeout.py::test_first": "passed",
        "test_timeout.py::test_spins": "failed",
        "test_timeout.py::test_after": "passed",
    }
    [spins] = [test for test in result.tests if test.nodeid == "test_timeout.py::test_spins"]
    assert "timed out after 2 s in mean.spin(...)" in spins.message
    assert 2 <= spins.duration < 10
    # The spinning process was killed; a new one ran the last test.
    assert len(result.submission_runs) == 2


def test_default_test_timeout_applies_to_tests_without_a_marker(tmp_path: Path, base: BaseLibrary) -> None:
    unmarked = "\n".join(line for line in TIMEOUT_TESTS["test_timeout.py"].splitlines() if "mark.timeout" not in line)
    tests = {"test_plain.py": unmarked}
    result = grade(tmp_path, tests, {"mean.py": SPINNING_MEAN}, base, test_timeout=1.5)
    assert (result.verdict, result.passed, result.failed) == (Verdict.FAILED, 2, 1), result.reason
    [spins] = [test for test in result.tests if test.outcome == "failed"]
    assert "timed out after 1.5 s in mean.spin(...)" in spins.message


def test_pytest_collects_unittest_classes_and_ignores_fixtures_named_test(tmp_path: Path, base: BaseLibrary) -> None:
    good = GOOD_FIB.replace("def fib(n):", "def fib(n):\n    if n < 0:\n        return 0")
    result = grade(tmp_path, UNITTEST_TESTS, {"fib.py": good}, base)
    assert result.verdict is Verdict.VERIFIED, result.reason
    assert sorted(test.nodeid for test in result.tests) == [
        "test_fixture_named_test.py::test_fib_values",
        "test_unittest.py::FibChecks::test_negative_is_zero",
        "test_unittest.py::FibChecks::test_ten",
    ]
