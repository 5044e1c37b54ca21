"""Walls every run holds in every isolation mode: no set-user-ID files, no process controlling another.

docs/isolation.md promises: "No run ever creates a set-user-ID or set-group-ID file" and "a process of
a run or a session cannot trace another".  Each test is a real run, through ``cellbox run`` or the
sandbox API, in modes ``none`` and ``auto``, as root and as a normal user; the keeper's own check of a
stopped process is tried on a real traced process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cellbox.cli import main
from cellbox.sandbox import confinement, run
from cellbox.sandbox.isolation import REFUSAL_WORDS, walls_refused
from cellbox.sandbox.snapshots import stop_problem, stop_process
from test_isolation import require_layers

# Each way to make a set-user-ID or set-group-ID file that a program of the run might take, then an
# ordinary chmod, which still works.  os.open reaches openat(2) through libc; mkdir(2) is let be, since
# Linux drops both bits from its mode.
SETID_ATTEMPTS = """
import os, shutil, stat
def attempt(call, *args, **kwargs):
    try:
        getattr(os, call)(*args, **kwargs)
        return 'made'
    except PermissionError:
        return 'PermissionError'
shutil.copy('/usr/bin/id', 'x')
fd, here = os.open('x', os.O_RDONLY), os.open('.', os.O_RDONLY)
print(attempt('chmod', 'x', 0o6755), attempt('fchmod', fd, 0o4755), attempt('chmod', 'x', 0o2755, dir_fd=here))
print(attempt('open', 'y', os.O_CREAT | os.O_WRONLY, 0o4755), attempt('mkdir', 'd', 0o2775))
print(attempt('mknod', 'n', stat.S_IFREG | 0o6644))
os.chmod('x', 0o755)
print(oct(os.stat('x').st_mode & 0o7777))
"""
REFUSED = "PermissionError"
SETID_REFUSED = f"{REFUSED} {REFUSED} {REFUSED}\n{REFUSED} made\n{REFUSED}\n0o755\n"


def assert_no_setid_file(folder: Path) -> None:
    """Nothing the attempts made in ``folder`` carries S_ISUID or S_ISGID (as the host sees it)."""
    assert os.stat(folder / "x").st_mode & 0o7777 == 0o755
    for name in ("y", "n"):
        assert not (folder / name).exists(), name
    assert (folder / "d").is_dir()  # made, without the bit: the loop below looks
    for path in folder.rglob("*"):
        assert not path.lstat().st_mode & 0o6000, path


def open_folder(tmp_path: Path) -> Path:
    """A working directory any user may write: as root, the ``user`` layer runs the program as nobody."""
    folder = tmp_path / "work"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


@pytest.mark.parametrize("mode", ["none", "auto"])
def test_cellbox_run_makes_no_set_user_id_file(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = open_folder(tmp_path)
    (folder / "setid.py").write_text(SETID_ATTEMPTS)
    monkeypatch.chdir(folder)
    assert main(["run", "--isolation", mode, "--", sys.executable, str(folder / "setid.py")]) == 0
    out, _err = capsys.readouterr()
    assert out == SETID_REFUSED
    assert_no_setid_file(folder)


# A process of the run tries to take control of another of its own: its child.
PROCESS_CONTROL = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
child = os.fork()
if child == 0:
    signal.pause()
    os._exit(0)
seize = libc.ptrace(0x4206, child, None, None)  # PTRACE_SEIZE
seize_errno = ctypes.get_errno()
pidfd = os.pidfd_open(child)
taken = libc.syscall(438, pidfd, 0, 0)  # pidfd_getfd(2): the child's stdin
print(seize, seize_errno, taken, ctypes.get_errno())
os.kill(child, signal.SIGKILL)
"""


@pytest.mark.parametrize("mode", ["none", "auto"])
def test_a_process_of_a_run_cannot_trace_or_take_fds_of_another(mode: str, tmp_path: Path) -> None:
    outcome = run([sys.executable, "-c", PROCESS_CONTROL], cwd=str(open_folder(tmp_path)), isolation=mode)
    assert outcome.stdout == "-1 1 -1 1\n"  # EPERM, from the filter: its own child is otherwise its to trace
    assert "syscall-filter" in outcome.isolation


MOUNTS = """
import os
home = os.environ['HOME']
for line in open('/proc/self/mountinfo'):
    fields = line.split()
    if fields[4] in ('/tmp', '/dev/shm', os.getcwd(), os.path.dirname(home)):
        print(fields[4] == os.getcwd() and 'cwd' or fields[4] == os.path.dirname(home) and 'task' or fields[4],
              'nosuid' in fields[5].split(','))
"""


def test_writable_folders_of_the_view_are_mounted_nosuid(tmp_path: Path) -> None:
    # bubblewrap mounts every bind and tmpfs MS_NOSUID: a set-user-ID file, however made, runs without it.
    require_layers("fs")
    outcome = run([sys.executable, "-c", MOUNTS], cwd=str(open_folder(tmp_path)), isolation="auto")
    assert sorted(outcome.stdout.splitlines()) == ["/dev/shm True", "/tmp True", "cwd True", "task True"]


def test_without_a_filter_a_run_without_isolation_says_what_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confinement, "socket_filter_missing", lambda: "libseccomp is not available (test)")
    outcome = run([sys.executable, "-c", "print('ran')"], cwd=str(tmp_path), isolation="none")
    assert outcome.stdout == "ran\n"
    words = ", ".join(REFUSAL_WORDS[group] for group in walls_refused(os.geteuid() == 0))
    assert f"syscall filter: not applied (libseccomp is not available (test)): {words}" in outcome.notes
    assert "syscall-filter" not in outcome.isolation


# --------------------------------------------------------------------------- the keeper's check of a stop


PTRACE_SEIZE = 0x4206


def _sleeping_child() -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "60"])
        finally:
            os._exit(127)
    return pid


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _wait_for_state(pid: int, wanted: str) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) != wanted:
        assert time.monotonic() < deadline, f"{pid} never reached state {wanted}, it is {_state(pid)}"
        time.sleep(0.01)


def _reap(pid: int) -> int:
    """Wait for ``pid`` to end (a tracer also hears of its stops); its terminating signal, or 0."""
    while True:
        _pid, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            return os.WTERMSIG(status)
        if os.WIFEXITED(status):
            return 0


def test_a_traced_stopped_process_is_not_taken_as_stopped_and_is_killed() -> None:
    # The keeper's SIGSTOP on a traced process is a ptrace stop (state t), which its tracer ends at will.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    pid = _sleeping_child()
    try:
        assert libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0, os.strerror(ctypes.get_errno())
        os.kill(pid, signal.SIGSTOP)
        _wait_for_state(pid, "t")
        assert stop_problem(pid) == f"it was traced (by pid {os.getpid()})"
        assert stop_process(pid) == f"it was traced (by pid {os.getpid()})"
        assert _reap(pid) == signal.SIGKILL
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_an_untraced_process_in_a_group_stop_is_stopped_and_a_running_one_is_not() -> None:
    pid = _sleeping_child()
    try:
        _wait_for_state(pid, "S")
        assert stop_problem(pid) == "it did not stop (state S)"
        assert stop_process(pid) is None
        assert _state(pid) == "T"
        assert stop_problem(pid) is None
    finally:
        os.kill(pid, signal.SIGKILL)
        _reap(pid)


@pytest.mark.parametrize(
    ("code", "stopped_problem"),
    [
        # Two threads: both must be in the group stop.
        ("threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)", None),
        # The leader left alone (pthread_exit): it is a zombie, the other thread runs on, and a SIGSTOP still
        # stops that one; read from the process's own status alone, the zombie leader would look stopped.
        (
            "threading.Thread(target=time.sleep, args=(60,)).start(); ctypes.CDLL(None).pthread_exit(None)",
            None,
        ),
    ],
    ids=["two-threads", "leader-exited"],
)
def test_every_thread_of_a_process_is_looked_at_before_it_counts_as_stopped(
    code: str, stopped_problem: str | None
) -> None:
    child = subprocess.Popen([sys.executable, "-c", f"import ctypes, threading, time; {code}"])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 or _state(child.pid) not in ("S", "Z"):
            assert time.monotonic() < deadline, "the child never had its second thread"
            time.sleep(0.01)
        time.sleep(0.1)  # both threads asleep
        assert stop_problem(child.pid) == "it did not stop (state S)"
        assert stop_process(child.pid) == stopped_problem
        assert stop_problem(child.pid) is None
    finally:
        child.kill()
        child.wait()


def test_a_held_process_is_alone_only_with_one_thread_and_no_child() -> None:
    # What the keeper asks of a cell's process before it keeps it as its own snapshot (alone_problem), from the
    # status text read once for the stop check and the peak too.
    from cellbox.sandbox.keeper import alone_problem, own_usage
    from cellbox.sandbox.snapshots import read_proc

    programs = {
        "two threads": "threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)",
        "a child": "subprocess.Popen(['sleep', '60']); time.sleep(60)",
        "alone": "big = bytearray(64 << 20); time.sleep(60)",
    }
    children = {
        name: subprocess.Popen(
            [sys.executable, "-c", f"import subprocess, threading, time; {code}"], start_new_session=True
        )
        for name, code in programs.items()
    }
    ready = {
        "two threads": lambda status, pid: b"\nThreads:\t2\n" in status,
        "a child": lambda status, pid: bool(read_proc(f"/proc/{pid}/task/{pid}/children").split()),
        "alone": lambda status, pid: int(status.split(b"VmHWM:")[1].split()[0]) > 64 << 10,
    }
    try:
        deadline = time.monotonic() + 30
        for name, child in children.items():  # each has its thread, its child or its memory
            while not ready[name](read_proc(f"/proc/{child.pid}/status"), child.pid):
                assert time.monotonic() < deadline, f"{name}: the program never got there"
                time.sleep(0.01)
        found = {}
        for name, child in children.items():
            assert stop_process(child.pid) is None
            status = read_proc(f"/proc/{child.pid}/status")
            found[name] = alone_problem(child.pid, status)
            if name == "alone":
                peak = int(status.split(b"VmHWM:")[1].split()[0])
                assert own_usage(child.pid, status)[1] == peak > 64 << 10  # KiB, the bytearray's 64 MiB in it
        assert found == {"two threads": "it had 2 threads", "a child": "it had children", "alone": None}
        assert alone_problem(children["alone"].pid, None) == "it is gone"
    finally:
        for child in children.values():
            os.killpg(child.pid, signal.SIGKILL)  # its sleep too
            child.wait()


def test_a_proc_read_longer_than_one_read_is_read_whole(tmp_path: Path) -> None:
    # A children file of a process with thousands of children is longer than one read: every pid must be there.
    from cellbox.sandbox.snapshots import PROC_READ, read_proc

    listing = tmp_path / "children"
    listing.write_bytes(b" ".join(b"%d" % pid for pid in range(100000, 100000 + PROC_READ // 3)) + b" ")
    assert read_proc(str(listing)) == listing.read_bytes()
    assert len(listing.read_bytes()) > 2 * PROC_READ


def test_a_process_below_a_spared_one_is_found_and_the_spared_one_is_not() -> None:
    # A run's process below a held snapshot (an at-fork handler's child) is the run's, and is killed with it.
    from cellbox.sandbox.keeper import subtree

    held = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
            "print(p.pid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert held.stdout is not None
        below = int(held.stdout.readline())
        assert set(subtree(os.getpid())) >= {held.pid, below}
        found = subtree(os.getpid(), {held.pid})
        assert below in found and held.pid not in found
    finally:
        os.kill(below, signal.SIGKILL)
        held.kill()
        held.wait()


def test_without_a_filter_a_root_run_leaves_no_set_user_id_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last wall where no filter can be loaded: the run's writable folders are swept after it ends.
    if os.geteuid() != 0:
        pytest.skip("only root's runs are swept: a normal user's set-user-ID file gives no one more than it has")
    monkeypatch.setattr(confinement, "socket_filter_missing", lambda: "libseccomp is not available (test)")
    folder = open_folder(tmp_path)
    code = "import os, shutil; shutil.copy('/usr/bin/id', 'x'); os.chmod('x', 0o6755)"
    code += "; os.mkdir('d'); os.chmod('d', 0o2775)"
    outcome = run([sys.executable, "-c", code], cwd=str(folder), isolation="none")
    assert outcome.status.value == "ok", outcome.stderr
    assert os.stat(folder / "x").st_mode & 0o7777 == 0o755
    assert not os.stat(folder / "d").st_mode & 0o6000
    removed = [note for note in outcome.notes if note.startswith("fs: set-user-ID and set-group-ID bits")]
    assert [sorted(note.split(": ", 2)[2].split(", ")) for note in removed] == [
        sorted([str(folder / "x"), str(folder / "d")])
    ]
