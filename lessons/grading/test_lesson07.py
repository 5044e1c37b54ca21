"""Hidden tests for lesson 7 (run_tree, survivors), run by ``cellbox grade`` against 07-kill-the-whole-group.ipynb."""

import importlib
import os
import signal
import time

import pytest

from cellbox.grading.bridge import submission_module, submission_tmp_path

NOTEBOOK, MODULE = "07-kill-the-whole-group.ipynb", "nb_07_kill_the_whole_group"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



# The notebook's code runs in its own sandboxed process (cellbox grade), with its own /proc and /tmp:
# the pid file and the process it names are looked at from there.
def _alive(pid):
    try:
        stat = submission_module("pathlib").Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill(pid):
    submission_module("os").kill(pid, signal.SIGKILL)


def _daemon_code(pid_file, child_sleeps):
    # The grandchild ignores SIGTERM, as a program may: only SIGKILL ends it for sure.
    return (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(60)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        f"time.sleep({child_sleeps})\n"
    )


def _wait_for(path):
    file = submission_module("pathlib").Path(path)
    for _ in range(100):
        if file.exists() and file.read_text():
            return int(file.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never wrote its grandchild's pid")


def test_run_tree_ok_and_error(nb):
    assert nb.run_tree("print('x')", 10) == "ok"
    for status in (1, 3, 4):
        assert nb.run_tree(f"raise SystemExit({status})", 10) == "error", f"exit status {status}"
    assert nb.run_tree("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 10) == "error"


def test_run_tree_reads_a_full_pipe(nb):
    # 200 KB on each stream fills a pipe (64 KB): a parent that waits without reading blocks the child.
    loud = "import sys; sys.stdout.write('x' * 200_000); sys.stderr.write('y' * 200_000)"
    assert nb.run_tree(loud, 5) == "ok"


def test_run_tree_kills_a_daemon_left_behind(nb):
    pid_file = os.path.join(submission_tmp_path(), "pid")
    assert nb.run_tree(_daemon_code(pid_file, 0), 10) == "ok"
    pid = _wait_for(pid_file)
    time.sleep(0.2)
    try:
        assert not _alive(pid)
    finally:
        if _alive(pid):
            _kill(pid)


def test_run_tree_times_out_and_kills_the_group(nb):
    pid_file = os.path.join(submission_tmp_path(), "pid")
    started = time.monotonic()
    assert nb.run_tree(_daemon_code(pid_file, 60), 1) == "timed_out"
    assert time.monotonic() - started < 10
    pid = _wait_for(pid_file)
    time.sleep(0.2)
    try:
        assert not _alive(pid)
    finally:
        if _alive(pid):
            _kill(pid)


def test_run_tree_keeps_the_deadline_while_a_grandchild_holds_the_pipe(nb):
    holder = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(8)'])\n"
    started = time.monotonic()
    nb.run_tree(holder, 1)
    assert time.monotonic() - started < 5


def test_survivors(nb):
    assert nb.survivors() == {
        "kill": True, "killpg": False, "killpg_after_setsid": True, "subreaper_sweep": False, "timeout_run": True,
    }
