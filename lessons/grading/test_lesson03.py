"""Hidden tests for lesson 3 (run_with_timeout, wait_or_kill), run by ``cellbox grade`` against 03-timeouts.ipynb."""

import importlib
import os
import time

import pytest

from cellbox.grading.bridge import submission_module, submission_tmp_path

NOTEBOOK, MODULE = "03-timeouts.ipynb", "nb_03_timeouts"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def test_run_with_timeout_ok(nb):
    assert nb.run_with_timeout("x = sum(range(1000))", 10) == "ok"


def test_run_with_timeout_error(nb):
    assert nb.run_with_timeout("raise ValueError('bad')", 10) == "error"


def test_run_with_timeout_any_nonzero_status_or_a_signal_is_error(nb):
    for status in (1, 2, 3, 4, 5):
        assert nb.run_with_timeout(f"import os; os._exit({status})", 10) == "error", f"exit status {status}"
    assert nb.run_with_timeout("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 10) == "error"


def test_run_with_timeout_times_out_without_raising(nb):
    # The child ends by itself after 6 s: an answer without a timeout says "ok" then, instead of hanging the test.
    started = time.monotonic()
    assert nb.run_with_timeout("import time; time.sleep(6)", 0.5) == "timed_out"
    assert time.monotonic() - started < 5


def _state(pid):
    """The state letter of the notebook's child ``pid`` (Z: a zombie), or None once it is gone and collected."""
    try:
        stat = submission_module("pathlib").Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_for(path):
    where = submission_module("pathlib").Path(path)
    for _ in range(200):
        if where.exists() and where.read_text():
            return int(where.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never wrote its pid")


def test_run_with_timeout_leaves_no_child_running(nb):
    pid_file = os.path.join(submission_tmp_path(), "pid")
    code = f"import os, time; open({pid_file!r}, 'w').write(str(os.getpid())); time.sleep(8)"
    assert nb.run_with_timeout(code, 2) == "timed_out"
    pid = _wait_for(pid_file)
    for _ in range(50):  # a killed child takes a moment to die
        left = _state(pid)
        if left in (None, "Z"):
            break
        time.sleep(0.02)
    try:
        assert left != "Z", "the child was killed but never collected (a zombie): wait for it after the kill"
        assert left is None, "the child was still running: Popen.wait(timeout) does not kill"
    finally:
        if left not in (None, "Z"):
            submission_module("os").kill(pid, 9)


def test_run_with_timeout_a_child_that_cannot_start_is_not_a_timeout(nb):
    # A NUL byte in an argument: subprocess refuses to start the child (ValueError), in whichever process
    # run_with_timeout runs.  Catching Exception would call that a timeout.
    try:
        got = nb.run_with_timeout("pass\0", 5)
    except (OSError, ValueError):
        got = "raised"
    assert got != "timed_out"


def _child(code):
    """A child of the notebook's own process (Popen there), running ``code``."""
    return submission_module("subprocess").Popen([submission_module("sys").executable, "-c", code])


def test_wait_or_kill_returns_the_return_code(nb):
    for status in (0, 1, 7):
        proc = _child(f"raise SystemExit({status})")
        assert nb.wait_or_kill(proc, 20) == status


def test_wait_or_kill_kills_and_collects_at_the_deadline(nb):
    # It ignores SIGTERM: proc.terminate() does not end it, proc.kill() does.
    proc = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(8)")
    time.sleep(0.5)
    started = time.monotonic()
    try:
        assert nb.wait_or_kill(proc, 0.5) is None
        assert time.monotonic() - started < 10
        pid = proc.pid
        stat = submission_module("pathlib").Path(f"/proc/{pid}/stat")
        assert not stat.exists(), "the child was killed but not collected (a zombie): call proc.wait() after kill"
        assert proc.returncode == -9, "the child was not killed and collected"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
