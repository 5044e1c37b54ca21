"""An instructor suite and a set of honest and hostile submissions, shared by the grading tests.

Each case is the files of one submission folder and the exact verdict the
grader must give it.  Two suites: the fib suite imports ``fib`` and checks
``fib(0)``, ``fib(1)``, ``fib(10)`` and three more; the mean suite (the
issue's) imports ``mean`` and checks ``mean([1, 2, 3]) == 2`` and
``mean([5]) == 5``.  Hostile cases are ``failed`` or ``unverified``, never
``verified``.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

INSTRUCTOR_TESTS = {
    "test_fib.py": """
        import fib

        def test_base_cases():
            assert fib.fib(0) == 0
            assert fib.fib(1) == 1

        def test_ten():
            assert fib.fib(10) == 55
    """,
    "test_more.py": """
        import pytest
        import fib

        @pytest.mark.parametrize("n, expected", [(2, 1), (3, 2), (7, 13)])
        def test_small(n, expected):
            assert fib.fib(n) == expected
    """,
}
INSTRUCTOR_TOTAL = 5  # collected tests: 2 + 3 parametrized

GOOD_FIB = textwrap.dedent("""
    def fib(n):
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a
""")

# A marker that every process a hostile submission leaves behind carries in its
# command line, so a test can look for survivors (unique to this test process,
# so a test suite running beside it cannot be mistaken for a survivor).
DAEMON_MARKER = f"cellbox-grading-daemon-{uuid.uuid4().hex}"

CASES: dict[str, tuple[dict[str, str], str]] = {
    "honest": ({"fib.py": GOOD_FIB}, "verified"),
    "buggy": ({"fib.py": "def fib(n):\n    return n\n"}, "failed"),
    "missing": ({"README.txt": "I did not finish.\n"}, "unverified"),
    "broken_import": ({"fib.py": GOOD_FIB + "\nraise RuntimeError('broken at import')\n"}, "unverified"),
    "hanging": (
        {
            "fib.py": GOOD_FIB + "\n_real = fib\ndef fib(n):\n    if n == 10:\n        import time\n"
            "        time.sleep(600)\n    return _real(n)\n"
        },
        "timed_out",
    ),
    "daemon": (
        {
            "fib.py": GOOD_FIB
            + f"""
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{DAEMON_MARKER}"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
        },
        "verified",
    ),
    "early_exit": ({"fib.py": GOOD_FIB + "\nimport os\nos._exit(0)\n"}, "unverified"),
    # Each call kills the submission's own process: that test fails, a new process runs the next one.
    "kills_its_process": (
        {"fib.py": "import os, signal\n\ndef fib(n):\n    os.kill(os.getpid(), signal.SIGKILL)\n"},
        "failed",
    ),
    # unittest.SkipTest is a skip to pytest; from the submission it is only an exception of the submission.
    "skips_tests": ({"fib.py": "import unittest\n\ndef fib(n):\n    raise unittest.SkipTest('not today')\n"}, "failed"),
    "imports_pytest": ({"fib.py": "import pytest\n" + GOOD_FIB}, "unverified"),
    "exits_in_test": ({"fib.py": "import sys\n\ndef fib(n):\n    sys.exit(0)\n"}, "failed"),
    "own_config": (
        {
            "fib.py": "def fib(n):\n    return n\n",
            "conftest.py": """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
""",
            "pytest.ini": "[pytest]\naddopts = -p no:cellbox.grading.reporter --co\npython_files = nothing_*.py\n",
            "tox.ini": "[pytest]\naddopts = --co\n",
            "setup.cfg": "[tool:pytest]\naddopts = --co\n",
        },
        "failed",
    ),
    "forged_channel": (
        {
            "fib.py": GOOD_FIB
            + """
import json, os
for fd in range(3, 20):
    for event in ("start", "collected", "finish"):
        message = {"event": event, "nonce": "0" * 32, "nodeids": [], "exitstatus": 0}
        try:
            os.write(fd, (json.dumps(message) + "\\n").encode())
        except OSError:
            pass
os._exit(0)
"""
        },
        "unverified",
    ),
    # Tries to change the worker library its process runs, for the submissions graded with or after it.
    "patches_worker": (
        {
            "fib.py": "def fib(n):\n    return n\n"
            + """
import os, subprocess, sys
for name in ("cellbox_worker", "cellbox_gateway_base", "cellbox_plain"):
    module = sys.modules.get(name)
    if module is None:
        continue
    folder = os.path.dirname(module.__file__)
    subprocess.run(["mount", "-o", "remount,rw,bind", folder], capture_output=True)
    for entry in os.listdir(folder):
        try:
            with open(os.path.join(folder, entry), "a") as handle:
                handle.write("# changed by a submission")
        except OSError:
            pass
"""
        },
        "failed",
    ),
}

# The suite of the issue: tests that import `mean` and check two values.
MEAN_TESTS = {
    "test_mean.py": """
        from mean import mean

        def test_three():
            assert mean([1, 2, 3]) == 2

        def test_one():
            assert mean([5]) == 5
    """,
}
GOOD_MEAN = "def mean(xs):\n    return sum(xs) / len(xs)\n"
WRONG_MEAN = "def mean(xs):\n    return 0\n"

# A record of passes as the reporter writes it, sent with whatever nonce can be found, on every descriptor.
FORGE_REPORTER = """
import json, os, sys
reporter = sys.modules.get("cellbox_grading_reporter") or sys.modules.get("cellbox.grading.reporter")
nonce = getattr(reporter, "_NONCE", "0" * 32)
ids = ["test_mean.py::test_three", "test_mean.py::test_one"]
events = [{"event": "start"}, {"event": "collected", "nodeids": ids}]
for nodeid in ids:
    events += [{"event": "started", "nodeid": nodeid},
               {"event": "report", "nodeid": nodeid, "when": "call", "outcome": "passed", "duration": 0.0},
               {"event": "finished", "nodeid": nodeid}]
events.append({"event": "finish", "exitstatus": 0})
lines = "".join(json.dumps({**event, "nonce": nonce}) + "\\n" for event in events).encode()
for fd in range(3, 64):
    try:
        os.write(fd, lines)
    except OSError:
        pass
os._exit(0)
"""

PATCH_REPORTS = """
try:
    from _pytest.reports import TestReport
    _original = TestReport.from_item_and_call

    def _passed(item, call):
        report = _original(item, call)
        report.outcome = "passed"
        report.longrepr = None
        return report

    TestReport.from_item_and_call = staticmethod(_passed)
except ImportError:
    pass  # no pytest in the submission's process: nothing to patch
"""

EQ_ALWAYS_TRUE = """
class Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

def mean(xs):
    return Anything()
"""

MEAN_CASES: dict[str, tuple[dict[str, str], str]] = {
    "mean_honest": ({"mean.py": GOOD_MEAN}, "verified"),
    "forges_reporter": ({"mean.py": WRONG_MEAN + FORGE_REPORTER}, "unverified"),
    "patches_test_report": ({"mean.py": PATCH_REPORTS + WRONG_MEAN}, "failed"),
    "eq_always_true": ({"mean.py": EQ_ALWAYS_TRUE}, "failed"),
    # The student's json.py would forge the record if it ever ran; it never does, in either process.
    "shadows_json": ({"mean.py": "import json\n" + WRONG_MEAN, "json.py": FORGE_REPORTER}, "failed"),
    # An honest student's own random.py (a dice helper) beside a correct mean.py.
    "own_random": ({"mean.py": "import random\n" + GOOD_MEAN, "random.py": "def roll():\n    return 4\n"}, "verified"),
    "exits_at_import": ({"mean.py": GOOD_MEAN + "import sys\nsys.exit(0)\n"}, "unverified"),
}

# One test loops forever and has a timeout marker, beside two that pass.
TIMEOUT_TESTS = {
    "test_timeout.py": """
        import pytest
        from mean import mean, spin

        def test_first():
            assert mean([1, 2, 3]) == 2

        @pytest.mark.timeout(2)
        def test_spins():
            assert spin() == 1

        def test_after():
            assert mean([5]) == 5
    """,
}
SPINNING_MEAN = GOOD_MEAN + "\ndef spin():\n    while True:\n        pass\n"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text, dedented) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def write_suite(root: Path) -> Path:
    """The instructor suite in ``root``."""
    return write_tree(root, INSTRUCTOR_TESTS)


def write_cases(
    root: Path, names: list[str] | None = None, cases: dict[str, tuple[dict[str, str], str]] | None = None
) -> dict[str, str]:
    """Write the named cases (default: all of ``cases``, default :data:`CASES`) as folder submissions.

    Returns id -> expected verdict.
    """
    cases = CASES if cases is None else cases
    expected = {}
    for name in names or list(cases):
        files, verdict = cases[name]
        write_tree(root / name, files)
        expected[name] = verdict
    return expected


# Looks for the grader's copy of the tests beside its own task directory and overwrites it.
FORGE_FILES = {
    "fib.py": "def fib(n):\n    return n\n"
    + """
import glob, os
tasks = os.path.dirname(os.path.dirname(os.path.dirname(os.getcwd())))
for path in glob.glob(os.path.join(tasks, "*grader*", "tests", "test_*.py")) + glob.glob(
        os.path.join(tasks, "*grader*", "*.ini")):
    try:
        with open(path, "w") as handle:
            handle.write("def test_fake():\\n    pass\\n")
    except OSError:
        pass
for name in ("results.json", "junit.xml", "report.xml"):
    with open(name, "w") as handle:
        handle.write('{"verdict": "verified"}')
"""
}
