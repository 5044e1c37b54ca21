"""Hidden tests for lesson 7 (run_tree, survivors), run by ``cellbox grade`` against 07-kill-the-whole-group.ipynb."""

import importlib
import os
import signal
import time

import pytest

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



def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_code(pid_file, child_sleeps):
    return (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        f"time.sleep({child_sleeps})\n"
    )


def _wait_for(path):
    for _ in range(100):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never wrote its grandchild's pid")


def test_run_tree_ok_and_error(nb):
    assert nb.run_tree("print('x')", 10) == "ok"
    assert nb.run_tree("raise SystemExit(3)", 10) == "error"


def test_run_tree_kills_a_daemon_left_behind(nb, tmp_path):
    pid_file = tmp_path / "pid"
    assert nb.run_tree(_daemon_code(pid_file, 0), 10) == "ok"
    pid = _wait_for(pid_file)
    time.sleep(0.2)
    try:
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_run_tree_times_out_and_kills_the_group(nb, tmp_path):
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    assert nb.run_tree(_daemon_code(pid_file, 60), 1) == "timed_out"
    assert time.monotonic() - started < 10
    pid = _wait_for(pid_file)
    time.sleep(0.2)
    try:
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_survivors(nb):
    assert nb.survivors() == {
        "kill": True, "killpg": False, "killpg_after_setsid": True, "subreaper_sweep": False, "timeout_run": True,
    }
