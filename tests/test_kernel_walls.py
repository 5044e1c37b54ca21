"""A hostile cell against the walls every session holds: the session's other processes, set-user-ID files.

A cell can reach every process of its session that shares its user and Landlock domain: its snapshots
and the spare.  These tests are cells a student can write in the default configuration, driven through
jupyter_client, and check two promises of docs/isolation.md: nothing a cell left runs between cells,
and no cell makes a set-user-ID or set-group-ID file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernelkit import descendants, execute, running_kernel
from sandboxkit import process_stat
from test_sandbox_walls import SETID_ATTEMPTS, SETID_REFUSED, assert_no_setid_file

# A kernel whose session filter leaves ptrace and its kin open, as on a machine without libseccomp (the
# rest of the filter stays): the keeper's own check must then catch the traced snapshot.
UNFILTERED = """
import sys, runpy
import cellbox.sandbox.isolation as isolation
walls = isolation.walls_refused
isolation.walls_refused = lambda as_root: tuple(g for g in walls(as_root) if g != 'process-control')
sys.argv = ['cellbox.kernel', '-f', sys.argv[1]]
runpy.run_module('cellbox.kernel', run_name='__main__', alter_sys=True)
"""


@pytest.fixture(params=["filtered", "unfiltered"])
def notebook(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[BlockingKernelClient, Path, int, bool]]:
    filtered = request.param == "filtered"
    if not filtered:
        spec = tmp_path / "kernels" / "kernels" / "cellbox-unfiltered"
        spec.mkdir(parents=True)
        argv = [sys.executable, "-c", UNFILTERED, "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "cellbox", "language": "python"}))
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "kernels"))
    work = tmp_path / "work"
    work.mkdir()
    name = "cellbox" if filtered else "cellbox-unfiltered"
    with running_kernel(name, cwd=str(work)) as (km, kc):
        yield kc, work, int(km.provisioner.process.pid), filtered  # type: ignore[union-attr]


def host_pid(kernel: int, inner: int) -> int | None:
    """The pid, as this process sees it, of the process below ``kernel`` that is ``inner`` in its pid namespace.

    The session may have a pid namespace of its own (proc(5): the NSpid line of /proc/PID/status).
    ``None`` when there is none (it was killed).
    """
    for pid in descendants(kernel):
        try:
            with open(f"/proc/{pid}/status") as f:
                line = next(line for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[-1]) == inner:
            return pid
    return None


def cpu_ticks(pid: int | None) -> int | None:
    """utime + stime of ``pid`` in clock ticks (proc(5) /proc/PID/stat fields 14 and 15), ``None`` when gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[11]) + int(fields[12])


def idle_ticks(pid: int | None) -> int:
    """Clock ticks of CPU ``pid`` used over one second while no cell runs (0 when it is gone)."""
    before = cpu_ticks(pid)
    time.sleep(1.0)
    after = cpu_ticks(pid)
    return 0 if before is None or after is None else after - before


# The at-fork handler runs in both children of the cell's command.  The snapshot (forked first) makes
# itself dumpable and starts a thread that names itself in a file and burns CPU; the spare (forked
# next) PTRACE_SEIZEs that thread before the keeper stops the snapshot (the command waits for both), so
# that the keeper's SIGSTOP
# becomes a ptrace stop.  The next cell, in the spare, lets go of the thread; the snapshot of that
# cell seizes it in its turn and continues it (PTRACE_CONT, no SIGCONT): it then runs while its tracer
# sits stopped as the session's newest snapshot, between cells.
LEAVE_TRACER = """
import ctypes, os, threading, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_forks = [0]
_seized = {}
def _burn():
    with open('snapshot.pid.part', 'w') as f:
        f.write(f'{os.getpid()} {threading.get_native_id()}')
    os.rename('snapshot.pid.part', 'snapshot.pid')
    while True:
        pass
def _wait_stop(tid):
    try:
        os.waitpid(tid, os.WNOHANG | 0x40000000)  # __WALL: the tracee's stop, reported to its tracer
    except OSError:
        pass
def _in_child():
    if _forks[0] == 0 and 'tid' not in _seized:  # the first cell's snapshot
        _forks[0] = 99
        _libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        threading.Thread(target=_burn, daemon=True).start()
    elif _forks[0] == 1 and 'tid' not in _seized:  # its spare, where the next cell runs
        _forks[0] = 0
        tid = int(open('snapshot.pid').read().split()[1])
        _seized.update(tid=tid, seize=_libc.ptrace(0x4206, tid, None, None))  # PTRACE_SEIZE
        open('seized', 'w').close()
    elif _forks[0] == 0:  # the next cell's snapshot
        _forks[0] = 99
        tid = _seized['tid']
        _seized['again'] = _libc.ptrace(0x4206, tid, None, None)
        pid = int(open('snapshot.pid').read().split()[0])
        for _attempt in range(50):  # until it runs: a seized stopped thread may trap once more
            time.sleep(0.01)
            _wait_stop(tid)
            _seized['cont'] = _libc.ptrace(7, tid, None, None)  # PTRACE_CONT
            with open(f'/proc/{pid}/task/{tid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'R':
                    break
        open('taken', 'w').close()
def _in_parent():
    _forks[0] += 1
    names = {1: 'taken' if 'tid' in _seized else 'snapshot.pid', 2: 'taken' if 'tid' in _seized else 'seized'}
    deadline = time.monotonic() + 10
    while not os.path.exists(names.get(_forks[0], '.')) and time.monotonic() < deadline:
        time.sleep(0.001)  # each child has done its part before the command goes on
os.register_at_fork(after_in_child=_in_child, after_in_parent=_in_parent)
state = 41
"""

LET_GO = """
_wait_stop(_seized.get('tid', 0))
_detach = _libc.ptrace(17, _seized.get('tid', 0), None, None)  # PTRACE_DETACH
print(_seized.get('seize'), _detach, state + 1)
"""


def test_a_snapshot_a_cell_traced_does_not_run_between_cells(
    notebook: tuple[BlockingKernelClient, Path, int, bool],
) -> None:
    # Promise: "nothing a cell left runs between cells, whatever it did to its own process and its
    # siblings".  The filter refuses ptrace (EPERM) inside the session, and the cell's state is kept;
    # without it the keeper kills the traced snapshot, and the cell's reply says its state is not kept.
    kc, where, kernel, filtered = notebook
    first = execute(kc, LEAVE_TRACER)
    assert first.status == "ok", first.traceback
    snapshot = host_pid(kernel, int((where / "snapshot.pid").read_text().split()[0]))
    second = execute(kc, LET_GO)
    after = execute(kc, "print(state)")
    assert idle_ticks(snapshot) == 0
    if filtered:
        assert "not kept" not in first.notes + first.stream("stderr")
        assert second.stream() == "-1 -1 42\n"  # PTRACE_SEIZE and PTRACE_DETACH refused
        assert after.stream() == "41\n"
        assert cpu_ticks(snapshot) is not None  # the snapshot is kept, and stopped
    else:
        # Its own line among the notes (a normal user's first cell also says the session's memory is unbounded).
        killed = "cellbox: what this cell defined is not kept: its snapshot was killed: it was traced (by pid "
        assert [line for line in first.notes.splitlines() if line.startswith(killed)], first.notes
        assert cpu_ticks(snapshot) is None
        assert [error["ename"] for error in after.errors] == ["NameError"]


# The cell leaves, in every process forked from it (its snapshot and spare), a POSIX timer that sends
# SIGCONT every 0.3 s from 1 s on (timer_create(2) may name any signal; the keeper has stopped both by
# then) and a SIGCONT handler that logs its pid and stops its process again with SIGSTOP.  The stop clears
# the "continued" report before the keeper can wait for it (waitid(2) WCONTINUED), so a check of
# continued reports alone saw nothing.
SELF_WAKING = """
import ctypes, os, signal, time
_libc = ctypes.CDLL(None, use_errno=True)
class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_byte * 48)]
class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
_log = os.open("woken.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def _on_cont(signum, frame):
    os.write(_log, f"{os.getpid()}\\n".encode())
    if not os.path.exists("woken.stop"):  # the test's last cell inherits the handler, and must not stop itself
        os.kill(os.getpid(), signal.SIGSTOP)
def _arm():
    timer = ctypes.c_void_p()
    _libc.timer_create(1, ctypes.byref(_Sigevent(signo=signal.SIGCONT, notify=0)), ctypes.byref(timer))
    period = (_Timespec * 2)(_Timespec(0, 300_000_000), _Timespec(1, 0))  # it_interval, it_value
    _libc.timer_settime(timer, 0, period, None)
signal.signal(signal.SIGCONT, _on_cont)
os.register_at_fork(after_in_child=_arm)
state = 41
"""


def test_a_snapshot_that_wakes_itself_and_stops_again_is_killed(tmp_path: Path) -> None:
    # Promise: "nothing a cell left runs between cells".  Each process may wake once before the keeper
    # sees its stop report (a stop it did not make, of a process it holds stopped) and kills it: every
    # process that woke is gone, nothing wakes after that, and the next cell is told.
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        kernel = int(km.provisioner.process.pid)  # type: ignore[union-attr]
        first = execute(kc, SELF_WAKING)
        assert first.status == "ok", first.traceback
        log = tmp_path / "woken.log"
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a second look at each process's wakes, and the keeper's kill
        woken = log.read_text().splitlines()
        time.sleep(1.5)
        later = log.read_text().splitlines()
        alive = [inner for inner in set(woken) if host_pid(kernel, int(inner)) is not None]
        # The next cell's process is forked from that state too, and arms the same timer: on a busy machine
        # (its 1 s can pass before it prints) its handler stopped it, and the cell ran to its wall limit.
        (tmp_path / "woken.stop").touch()
        after = execute(kc, "print('after')")
    # At most twice each (a wake the keeper races); none at all where the keeper, which runs before the cells'
    # nice 19 on a busy machine, kills a woken process before its handler runs.  The note says it was woken.
    assert len(woken) <= 2 * len(set(woken)), woken
    assert later == woken
    assert alive == []
    assert after.status == "ok" and after.stream() == "after\n"
    assert "continued from outside the session" in after.notes


def test_a_cell_makes_no_set_user_id_file(tmp_path: Path) -> None:
    # Promise: "no run ever creates a set-user-ID or set-group-ID file", a kernel cell's included.
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        result = execute(kc, SETID_ATTEMPTS)
    assert result.status == "ok", result.traceback
    assert result.stream() == SETID_REFUSED
    assert_no_setid_file(tmp_path)


# A cell's own outputs dressed as cellbox's notes: a display_data of the note mimetype, and a note on the
# channel the cell runner speaks to the kernel on (fd 3), which the cell's process shares.
FORGE_NOTES = """
import json, os
from IPython.display import display
forged = "cellbox: note: this cell's limits were lifted by the administrator"
display({"text/plain": forged, "application/vnd.cellbox.note+json": {"text": forged}}, raw=True)
os.write(3, (json.dumps({"type": "note", "text": forged}) + "\\n").encode())
os.write(3, (json.dumps({"type": "threads_left", "count": "many"}) + "\\n").encode())
os.write(3, (json.dumps({"type": "debugger_failed", "text": forged}) + "\\n").encode())
print("sent")
"""


def test_a_cell_cannot_forge_cellboxs_notes(tmp_path: Path) -> None:
    # Promise (docs/kernel.md, "cellbox's notes"): a note of the note mimetype, and the reply's
    # kernel_notes, are cellbox's own word.  The cell's display keeps its text, without the mimetype.
    from cellbox.kernel.kernel import NOTE_MIMETYPE

    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        result = execute(kc, FORGE_NOTES)
    assert result.status == "ok", result.traceback
    assert result.stream() == "sent\n"
    shown = [c["data"] for c in result.of("display_data")]
    forged = "cellbox: note: this cell's limits were lifted by the administrator"
    assert {"text/plain": forged} in shown
    assert forged not in result.notes
    assert forged not in result.metadata.get("cellbox", {}).get("kernel_notes", [])
    assert all(NOTE_MIMETYPE not in data or data["text/plain"] != forged for data in shown)
    # A word the runner may send (its debugger did not start) gives the kernel's own fixed note, never its text.
    assert [line for line in result.notes.splitlines() if "debugger" in line] == [
        "cellbox: the debugger could not start in this cell (stderr says why); it ran without it"
    ]


# The command names its snapshot to the keeper on a socket the cell's process holds (the lowest socket fd):
# the cell sends its own word there first, with ten descriptors beside it.
SEND_FDS_TO_THE_KEEPER = """
import json, os, socket
def _link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
ours = sorted(int(fd) for fd in os.listdir("/proc/self/fd") if _link(fd).startswith("socket:"))
sent = [os.open("/dev/null", os.O_RDONLY) for _ in range(10)]
following = socket.socket(fileno=os.dup(ours[0]))
socket.send_fds(following, [json.dumps({"event": "snapshot"}).encode()], sent)
socket.send_fds(following, [b"not json"], sent)  # and words that are not messages, with descriptors too
socket.send_fds(following, [b"[" * 100_000], sent)
socket.send_fds(following, [b""], sent)
for fd in sent:
    os.close(fd)
state += 1
"""


def keeper_fds(kernel: int) -> int:
    """How many descriptors the session's keeper holds once settled (skips where its /proc/PID/fd is closed to
    this user)."""
    # A run's processes end while the tree is read: one gone by then has no stat (None), and is not the keeper.
    keepers = [pid for pid in descendants(kernel) if (process_stat(pid) or (b"",))[0] == b"cellbox-keeper"]
    try:
        counts = []
        for _ in range(10):  # the fewest over a second: a run's pipes close a moment after its reply
            counts.append(len(os.listdir(f"/proc/{keepers[0]}/fd")))
            time.sleep(0.1)
        return min(counts)
    except OSError:
        pytest.skip("the keeper is not dumpable, and only root may list its descriptors")


def test_descriptors_a_cell_sends_the_keeper_are_closed(tmp_path: Path) -> None:
    # Promise (design.md): a trusted process takes nothing a cell made; the keeper read the message and
    # kept its descriptors, ten more each cell, until it ran out.
    # undo_depth=1: from the second cell on, each cell's kept snapshot (and its socket) takes the place of one.
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.undo_depth=1"]) as (km, kc):
        kernel = int(km.provisioner.process.pid)  # type: ignore[union-attr]
        assert execute(kc, "state = 1").status == "ok"
        # Under a wall limit the test would reach only if the keeper took a sent word for the cell's own.
        sender = f"%%limits wall=10\n{SEND_FDS_TO_THE_KEEPER}"
        replies = [execute(kc, sender)]
        before = keeper_fds(kernel)  # after one such cell, so that the spare and sockets are as after the others
        replies += [execute(kc, sender) for _ in range(3)]
        after = keeper_fds(kernel)
        final = execute(kc, "print(state)")
    assert after == before
    assert [reply.status for reply in replies] == ["ok"] * 4, replies[0].traceback
    # Each cell's own snapshot was taken at its end, past the words it sent first: the state went on.
    assert final.stream() == "5\n"


# Every way a process may signal another, aimed at the keeper (the cell's parent): kill(2),
# pidfd_send_signal(2), and the kernel's own SIGIO of F_SETOWN/F_SETSIG (fcntl(2)) with SIGKILL.
SIGNAL_THE_KEEPER = """
import ctypes, fcntl, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keeper = os.getppid()
for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
    try:
        os.kill(keeper, sig)
        print("delivered")
    except PermissionError:
        print("refused")
pidfd = libc.syscall(434, keeper, 0)  # pidfd_open
print("refused" if libc.syscall(424, pidfd, signal.SIGKILL, 0, 0) == -1 else "delivered")  # pidfd_send_signal
a, b = socket.socketpair()
fcntl.fcntl(a, fcntl.F_SETOWN, keeper)
fcntl.fcntl(a, fcntl.F_SETSIG, signal.SIGKILL)
fcntl.fcntl(a, fcntl.F_SETFL, fcntl.fcntl(a, fcntl.F_GETFL) | os.O_ASYNC)
b.send(b"x")  # the kernel sends SIGKILL to the owner, unless the signal scope stops it
state = 2
"""


def test_a_cell_cannot_signal_the_keeper_in_any_way(tmp_path: Path) -> None:
    # Promise (docs/isolation.md, the keeper): "outside the Landlock domain its snapshots and cells are in,
    # so none of them can signal or trace it".
    from cellbox.sandbox.isolation import landlock_abi

    if landlock_abi() < 6:
        pytest.skip("no Landlock signal scope (ABI 6, Linux 6.12) here: the first cell's notes say so")
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        first = execute(kc, SIGNAL_THE_KEEPER)
        after = execute(kc, "print(state)")
    assert first.status == "ok", first.traceback
    assert first.stream() == "refused\n" * 4
    assert after.stream() == "2\n"  # the keeper lived, and kept the state
