"""The supervisor out of the program's reach: a program that goes after it, or a supervisor lost anyway.

Each test runs a real child and asserts the exact status and what is left
running afterwards.  Runs as root and as a normal user; what differs (a pids
cgroup only root can write) is said where it matters.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading

import pytest

from cellbox.kernel.cellerrors import error_for_outcome
from cellbox.sandbox import pids_cgroup_root, run
from cellbox.sandbox.isolation import landlock_abi
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from sandboxkit import marker, survivors

IS_ROOT = os.geteuid() == 0
SIGNAL_SCOPE = landlock_abi() >= 6
LIMITS = Limits(wall_time=20, cpu_time=10, memory=512 * 1024**2)

# The program: a double-forked daemon that closes every descriptor
# (as root it first leaves the run's pids cgroup for the root one), then SIGKILL
# to the supervisor.  MARK is in the daemon's argv[0], to find it afterwards.
GOES_AFTER_ITS_SUPERVISOR = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if os.geteuid() == 0:
            try:
                with open("/sys/fs/cgroup/pids/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass
        os.closerange(0, 1024)
        os.execvp("sleep", ["sleep-MARK", "47"])
    os._exit(0)
time.sleep(0.3)
try:
    os.kill(os.getppid(), signal.SIGKILL)
    print("supervisor killed")
except OSError as exc:
    print("refused", type(exc).__name__)
"""


def python(code: str, mark: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code).replace("MARK", mark)]


@pytest.mark.skipif(not SIGNAL_SCOPE, reason="needs Landlock's signal scope (ABI 6, Linux 6.12)")
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_program_cannot_kill_its_supervisor_and_its_escaped_daemon_is_killed(isolation: str) -> None:
    mark = marker()
    outcome = run(python(GOES_AFTER_ITS_SUPERVISOR, mark), limits=LIMITS, isolation=isolation, cwd="/tmp")
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "refused PermissionError\n"
    assert "signal-scope" in outcome.isolation
    assert outcome.killed_processes == 1  # the daemon, found as the subreaper's child
    assert not outcome.supervisor_lost
    assert survivors(mark) == []


@pytest.mark.skipif(not SIGNAL_SCOPE, reason="needs Landlock's signal scope (ABI 6, Linux 6.12)")
def test_program_cannot_signal_or_read_the_memory_of_its_supervisor_or_the_parent() -> None:
    code = """
        import os
        supervisor = os.getppid()
        for who, pid in (("supervisor", supervisor), ("parent", PARENT)):
            try:
                os.kill(pid, signal.SIGTERM)
                print(who, "signalled")
            except OSError as exc:
                print(who, type(exc).__name__, end=" ")
            try:
                open(f"/proc/{pid}/mem", "rb").read(1)
                print("mem read")
            except OSError as exc:
                print(type(exc).__name__)
    """
    code = "import signal\n" + textwrap.dedent(code).replace("PARENT", str(os.getpid()))
    outcome = run([sys.executable, "-c", code], limits=LIMITS, isolation="none")
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "supervisor PermissionError PermissionError\nparent PermissionError PermissionError\n"


def test_lost_supervisor_is_reported_and_the_processes_it_left_are_killed() -> None:
    # A supervisor killed from outside (as a program without the signal scope
    # could): the parent finds the run's processes by session, group and cgroup.
    mark = marker()
    code = """
        import os, time
        if os.fork() == 0:
            time.sleep(60)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep-MARK", "60"])
            os._exit(0)
        time.sleep(0.2)
        print("supervisor", os.getppid(), flush=True)
        time.sleep(60)
    """
    killed = threading.Event()
    seen: list[str] = []

    def kill_supervisor(text: str) -> None:
        seen.append(text)  # unbuffered: print's parts may come one by one
        line = "".join(seen)
        if line.startswith("supervisor ") and line.endswith("\n") and not killed.is_set():
            killed.set()
            os.kill(int(line.split()[1]), signal.SIGKILL)

    outcome = run(python(code, mark), limits=LIMITS, isolation="none", on_stdout=kill_supervisor)
    assert killed.is_set(), outcome.stdout
    assert outcome.status is Status.CRASHED
    assert outcome.signal == "SIGKILL"
    assert outcome.supervisor_lost
    [note] = [note for note in outcome.notes if note.startswith("the run's supervisor ended without reporting")]
    assert note.endswith("processes that left the run's session may have escaped")
    left = survivors(mark)
    if pids_cgroup_root() is not None:
        # The setsid daemon left the session but not the run's pids cgroup.
        assert left == []
        assert outcome.killed_processes == 3  # the program, its sleeper, the daemon
    else:
        # The setsid daemon left the session: once it is re-parented to init
        # nothing tells it from any other process of the user, and it may escape.
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert len(left) <= 1
        assert outcome.killed_processes == 3 - len(left)  # the program, its sleeper (and the daemon, if found)
    ename, evalue = error_for_outcome(outcome, LIMITS) or ("", "")
    assert ename == "CellCrashedError"
    assert "supervisor was killed" in evalue and "may have escaped" in evalue
    assert "out-of-memory" not in evalue
