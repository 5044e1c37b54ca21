"""Hidden tests for lesson 6 (run_both_clocks, which_clock, how_long),
run by ``cellbox grade`` against 06-both-clocks.ipynb."""

import importlib
import re
import time

import pytest

from cellbox.grading.bridge import submission_module, submission_tmp_path

NOTEBOOK, MODULE = "06-both-clocks.ipynb", "nb_06_both_clocks"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


# Children that end by themselves: a wrong answer gives a wrong word at once instead of hanging the test.
SPIN_2S = "import time\nend = time.process_time() + 2\nwhile time.process_time() < end: pass"


def test_run_both_clocks_ok_and_error(nb):
    assert nb.run_both_clocks("pass", 2, 10) == "ok"
    for status in (1, 2, 3, 4, 5, 9):
        assert nb.run_both_clocks(f"import sys; sys.exit({status})", 2, 10) == "error", status


def test_run_both_clocks_other_signals_are_errors(nb):
    for name in ("SIGSEGV", "SIGTERM"):
        code = ("import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                f"os.kill(os.getpid(), signal.{name})")
        assert nb.run_both_clocks(code, 2, 10) == "error", name


def test_run_both_clocks_spinning_is_cpu_limit(nb):
    assert nb.run_both_clocks(SPIN_2S, 1, 30) == "cpu_limit"


def test_run_both_clocks_sigxcpu_and_sigkill_are_cpu_limit(nb):
    # What the kernel sends at the soft and at the hard CPU limit (to a child that ignores SIGXCPU), sent by the
    # child to itself: how they are read, without spending the CPU seconds.
    for name in ("SIGXCPU", "SIGKILL"):
        assert nb.run_both_clocks(f"import os, signal; os.kill(os.getpid(), signal.{name})", 2, 10) == "cpu_limit", name


def test_run_both_clocks_hard_cpu_limit_one_above(nb):
    code = "import resource, sys; sys.exit(0 if resource.getrlimit(resource.RLIMIT_CPU) == (2, 3) else 3)"
    assert nb.run_both_clocks(code, 2, 10) == "ok"


def test_run_both_clocks_blocked_socket_is_timed_out(nb):
    # The socket gives up after 8 s: without a wall deadline the child ends with an error, not a hang.
    code = "import socket\na, b = socket.socketpair()\na.settimeout(8)\na.recv(1)"
    started = time.monotonic()
    assert nb.run_both_clocks(code, 1, 1) == "timed_out"
    assert time.monotonic() - started < 6


def test_run_both_clocks_a_sleeper_under_the_wall_deadline_is_ok(nb):
    assert nb.run_both_clocks("import time; time.sleep(1.5)", 1, 10) == "ok"


def test_which_clock(nb):
    assert nb.which_clock() == {"a": "cpu_limit", "b": "timed_out", "c": "timed_out", "d": "ok"}


def test_how_long_measures_a_sleeper_on_the_wall_clock(nb):
    flag = submission_module("os").path.join(submission_tmp_path(), "done")
    took = nb.how_long(f"import time; time.sleep(1); open({flag!r}, 'w').close()")
    assert isinstance(took, float) and 0.9 <= took < 10
    assert submission_module("os").path.exists(flag), "how_long returned before the child exited"


def test_how_long_reads_a_clock_that_only_moves_forward(nb):
    # time.time() and datetime's now() jump when someone sets the system clock; a duration needs time.monotonic().
    # Only an answer that measures is judged by its source (a blank one names no clock either).
    took = nb.how_long("pass")
    assert isinstance(took, float) and 0 <= took < 10
    source = submission_module("inspect").getsource(nb.how_long)
    assert not re.search(r"\btime\.time(_ns)?\s*\(|\b(now|utcnow|today)\s*\(|(?<![\w.])time(_ns)?\s*\(\s*\)", source), (
        "how_long reads a clock that jumps when the system clock is set (time.time, datetime.now): use time.monotonic()"
    )
