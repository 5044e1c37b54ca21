"""An instructor suite and a set of honest and hostile submissions, shared by the grading tests.

Each case is the files of one submission folder and the exact verdict the
grader must give it.  Module names: the suite imports ``fib`` (folder
submissions) and checks ``fib(0)``, ``fib(1)``, ``fib(10)``.
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
        {"fib.py": GOOD_FIB + "\n_real = fib\ndef fib(n):\n    if n == 10:\n        import time\n"
                              "        time.sleep(600)\n    return _real(n)\n"},
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
    "kills_pytest": (
        {"fib.py": "import os, signal\n\ndef fib(n):\n    os.kill(os.getpid(), signal.SIGKILL)\n"},
        "unverified",
    ),
    "skips_tests": ({"fib.py": "import pytest\n\ndef fib(n):\n    pytest.skip('not today')\n"}, "failed"),
    "pytest_exit_in_test": (
        {"fib.py": GOOD_FIB + "\nimport pytest\n_real = fib\ndef fib(n):\n"
                              "    if n == 10:\n        pytest.exit('done', returncode=0)\n    return _real(n)\n"},
        "unverified",
    ),
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
            "pytest.ini": "[pytest]\naddopts = -p no:cellbox_grading_reporter --co\npython_files = nothing_*.py\n",
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
for event in ("start", "collected", "finish"):
    message = {"event": event, "nonce": "0" * 32, "nodeids": [], "exitstatus": 0}
    os.write(3, (json.dumps(message) + "\\n").encode())
os._exit(0)
"""
        },
        "unverified",
    ),
    "patches_pytest": (
        {
            "fib.py": "def fib(n):\n    return n\n"
            + """
import os, subprocess, _pytest, cellbox_grading_reporter
# Try to change the grader's pytest and reporter for the submissions graded with or after this one,
# first making a read-only view writable (a root child with its capabilities can).
for module in (_pytest, cellbox_grading_reporter):
    folder = os.path.dirname(os.path.dirname(module.__file__))
    subprocess.run(["mount", "-o", "remount,rw,bind", folder], capture_output=True)
for module in (_pytest, cellbox_grading_reporter):
    folder = os.path.dirname(module.__file__)
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name), "a") as handle:
                handle.write("# changed by a submission")
        except OSError:
            pass
"""
        },
        "failed",
    ),
    "forged_files": (
        {
            "fib.py": "def fib(n):\n    return n\n"
            + """
import glob, os, sys
# Overwrite every test file and ini it can find, and leave fake reports about.
for folder in sys.path:
    for path in glob.glob(os.path.join(folder, "test_*.py")) + glob.glob(os.path.join(folder, "..", "*.ini")):
        with open(path, "w") as handle:
            handle.write("def test_fake():\\n    pass\\n")
for name in ("results.json", "junit.xml", "report.xml", ".pytest_cache"):
    with open(name, "w") as handle:
        handle.write('{"verdict": "verified"}')
"""
        },
        "unverified",
    ),
}


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


def write_cases(root: Path, names: list[str] | None = None) -> dict[str, str]:
    """Write the named cases (default: all) as folder submissions; return id -> expected verdict."""
    expected = {}
    for name in names or list(CASES):
        files, verdict = CASES[name]
        write_tree(root / name, files)
        expected[name] = verdict
    return expected
