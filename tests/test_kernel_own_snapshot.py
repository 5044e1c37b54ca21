"""A cell's own process as its snapshot: which cells take that way, and what the keeper checks of it.

A cell that ends well with one thread, no children and nothing that reaches
its memory from its spare stops as the next snapshot (one fork, no exit: see
:func:`cellbox.sandbox.snapshots.become_own_snapshot`); any other cell's
snapshot is a fork of its process, as before.  Which way a cell took shows in
the next cell: the earlier cell's process is still there, stopped, or gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from cellbox.sandbox.snapshots import TID_OFFSET, find_tid_offset
from kernelkit import execute, running_kernel

# Where the machine has no sibling fork (clone(2) with CLONE_PARENT), every cell takes the copy's way.
OWN_WAY = (TID_OFFSET if TID_OFFSET is not None else find_tid_offset()) is not None

# What the next cell sees of the process of the cell before (its pid in `me`).
LOOK = """
import os
try:
    with open(f"/proc/{me}/status") as f:
        fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    print(fields["Name"].strip(), fields["State"].split()[0], fields["TracerPid"].strip(), fields["Threads"].strip())
except FileNotFoundError:
    print("gone")
"""


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingKernelClient]:
    notebook = tmp_path_factory.mktemp("notebook")
    notebook.chmod(0o755)
    with running_kernel("cellbox", cwd=str(notebook)) as (_km, client):
        yield client


def ok(kc: BlockingKernelClient, code: str) -> str:
    result = execute(kc, code)
    assert result.status == "ok", (code, result.errors, result.stream("stderr"))
    return result.stream()


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_a_cell_that_ends_alone_is_its_snapshot_in_a_group_stop_untraced_with_one_task(
    kc: BlockingKernelClient,
) -> None:
    ok(kc, "import os\nme = os.getpid()\nalone = 'kept'")
    assert ok(kc, LOOK) == "cellbox-snap T 0 1\n"
    assert ok(kc, "print(alone)") == "kept\n"


@pytest.mark.parametrize(
    "leaves",
    [
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()",
        "import subprocess\nchild = subprocess.Popen(['sleep', '30'])",
        "import socket\npair = socket.socketpair()",
        "memory_file = open('/proc/self/mem', 'rb')",
        "import fcntl\nlocked = open('locked.txt', 'w')\nfcntl.lockf(locked, fcntl.LOCK_EX)",
    ],
    ids=["thread", "child", "socket", "memory-file", "record-lock"],
)
def test_a_cell_that_leaves_a_thread_a_child_or_a_way_into_its_memory_keeps_its_state_in_a_copy(
    kc: BlockingKernelClient, leaves: str
) -> None:
    ok(kc, f"import os\nme = os.getpid()\n{leaves}\nvalue = 41")
    assert ok(kc, LOOK) == "gone\n"  # its snapshot is a fork: the cell's process ended
    assert ok(kc, "value += 1\nprint(value)") == "42\n"


def test_a_fork_handler_that_starts_a_thread_runs_no_code_after_the_reply(tmp_path: Path) -> None:
    # The handler runs as the cell's process forks its spare, after the cell: a thread it starts in the
    # cell's process would run on in the snapshot unless that process takes the copy's way.
    code = """
import os, threading, time
def tick():
    time.sleep(0.2)
    while True:
        with open('ticks.txt', 'a') as f:
            f.write('.')
        time.sleep(0.01)
os.register_at_fork(before=lambda: threading.Thread(target=tick, daemon=True).start())
me = os.getpid()
mark = 'kept'
"""
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        tmp_path.chmod(0o755)
        ok(kc, code)
        ticks = tmp_path / "ticks.txt"
        time.sleep(0.5)
        before = ticks.stat().st_size if ticks.exists() else 0
        time.sleep(1.0)
        assert (ticks.stat().st_size if ticks.exists() else 0) == before
        assert ok(kc, LOOK) == "gone\n"
        assert ok(kc, "print(mark)") == "kept\n"


FORGED = """
import json, os, signal, socket, threading, time
forger = os.getpid()
print(forger)
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
for name in os.listdir('/proc/self/fd'):
    try:
        if os.readlink(f'/proc/self/fd/{name}').startswith('socket:'):
            socket.socket(fileno=os.dup(int(name))).send(json.dumps({"event": "snapshot", "pid": forger}).encode())
    except OSError:
        pass
os.kill(forger, signal.SIGSTOP)
"""


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_a_cell_that_stops_itself_as_its_snapshot_with_a_thread_is_not_kept(kc: BlockingKernelClient) -> None:
    ok(kc, "before_forged = 'before'")
    result = execute(kc, FORGED)
    assert result.status == "ok"
    assert "what this cell defined is not kept: its snapshot was killed: it had 2 threads" in result.notes
    assert ok(kc, f"me = {int(result.stream())}\n{LOOK}") == "gone\n"
    assert ok(kc, "print(before_forged, 'forger' in dir())") == "before False\n"


# The cell's two SOCK_SEQPACKET sockets, as `ends`: the keeper made the snapshot's pair first, then the spare's.
CELL_ENDS = """
import json, os, socket
found = []
for name in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        continue
    if link.startswith("socket:"):
        found.append((int(link[8:-1]), int(name)))
ends = []
for _inode, fd in sorted(found):
    end = socket.socket(fileno=os.dup(fd))
    if end.type == socket.SOCK_SEQPACKET:
        ends.append(end)
    else:
        end.close()
"""

# Words a cell sends on each SOCK_SEQPACKET socket it holds (its snapshot socket and its spare's) before it
# ends: one that names no process, one that names the keeper, and ones that are not messages.
WORDS_FIRST = (
    CELL_ENDS
    + """
for sent in ends:
    with sent:
        for word in ({"event": "snapshot", "pid": 1}, {"event": "snapshot", "pid": os.getppid()}):
            sent.send(json.dumps(word).encode())
        for word in (b"not json", b"[" * 100_000, b""):
            sent.send(word)
"""
)


@pytest.mark.parametrize(
    "way",
    ["", "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()"],
    ids=["own", "copy"],
)
def test_words_a_cell_sends_before_its_end_do_not_hide_the_word_its_snapshot_sends(
    kc: BlockingKernelClient, way: str
) -> None:
    # The keeper read one word at the stop (or exit): the cell's first word hid the snapshot's own, and the
    # cell ran to its wall limit (own way) or lost its state (copy's way).
    ok(kc, "count = 1")
    for _ in range(2):
        result = execute(kc, f"%%limits wall=10\n{way}\n{WORDS_FIRST}\ncount += 1")
        assert result.status == "ok", (result.errors, result.notes)
        assert not result.notes
    assert ok(kc, "print(count)") == "3\n"


# A fork handler of the cell's runs in its snapshot as the snapshot forks a run: there it names the spare (the
# keeper's child, stopped, held for the next cell) as the run's command, before the snapshot's own reply.
FORK_REPLY_NAMES_THE_SPARE = """
import json, os, socket
_cell, _keeper = os.getpid(), os.getppid()
def _name_the_spare():
    if os.getpid() == _cell:
        return
    spares = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) <= os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                tail = f.read().rpartition(b")")[2]
        except OSError:
            continue
        # Any later child of the keeper's: the spare's name is not yet its own when the keeper stopped it first.
        if int(tail.split()[1]) == _keeper:
            spares.append(int(name))
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            end = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with end:
            if end.type == socket.SOCK_SEQPACKET and spares:
                end.send(json.dumps({"pid": max(spares)}).encode())
os.register_at_fork(after_in_parent=_name_the_spare)
count += 1
"""


def test_a_snapshot_that_names_the_spare_as_its_runs_command_is_dropped(kc: BlockingKernelClient) -> None:
    # The keeper took the spare for the completion's command: the run's kill then waited for a process it
    # spares (kill_run), the keeper spun until the kernel ended the session, and every state was lost.
    ok(kc, "count = 1")
    ok(kc, FORK_REPLY_NAMES_THE_SPARE)
    code = "cou"
    msg_id = kc.complete(code, len(code))
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"]["msg_id"] != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert "count" in reply["content"]["matches"]  # answered from the state before (the snapshot was dropped)
    assert ok(kc, "print(count)") == "1\n"  # the session went on; only the forging cell's own state is gone


# More words on the spare's socket than the keeper reads at once (the cell raises its socket's send buffer).
SPARE_FLOOD = (
    CELL_ENDS
    + """
spare_end = ends[-1]
spare_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
spare_end.setblocking(False)
sent = 0
try:
    for _ in range(WORDS):
        spare_end.send(b"")
        sent += 1
except BlockingIOError:
    pass
for end in ends:
    end.close()
print(sent)
count += 1
"""
)


def test_more_words_on_the_spares_socket_than_the_keeper_reads_do_not_end_the_next_cell(
    kc: BlockingKernelClient,
) -> None:
    # The keeper read MAX_QUEUED_WORDS of them and closed the socket over the rest: the spare's read of the
    # next run's request failed (ECONNRESET, unix(7)), and the next cell ended at once.
    from cellbox.sandbox.snapshots import MAX_QUEUED_WORDS

    ok(kc, "count = 1")
    for turn in range(3):  # whether the spare reads before the keeper's close is the machine's to say: a few times
        sent = int(ok(kc, SPARE_FLOOD.replace("WORDS", str(3 * MAX_QUEUED_WORDS))))
        if sent <= MAX_QUEUED_WORDS:
            pytest.skip("this machine's socket buffers (net.core.wmem_max) hold no more words than the keeper reads")
        assert ok(kc, "print(count)") == f"{turn + 2}\n"


# The cell names itself first, with a shared memory fact of its own: a size no float holds.
HUGE_SHARED = (
    CELL_ENDS
    + """
forged = {"count": 1, "bytes": 10**4000, "names": ["forged"]}
ends[0].send(json.dumps({"event": "snapshot", "pid": os.getpid(), "spare": None, "shared": forged}).encode())
for end in ends:
    end.close()
"""
)


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_a_shared_memory_fact_no_float_holds_is_not_taken(kc: BlockingKernelClient) -> None:
    # The keeper passed the cell's size on; the kernel's note on the next cell whose state was dropped formatted
    # it (limits.format_size: OverflowError), and that cell got no reply.
    ok(kc, HUGE_SHARED)
    result = execute(kc, "%%limits wall=1\nimport time\ntime.sleep(30)", timeout=30)
    assert result.content["ename"] == "CellTimeoutError"
    assert "forged" not in result.traceback


def test_queued_words_reads_every_message_and_closes_what_came_with_each() -> None:
    import json
    import os
    import socket

    from cellbox.sandbox.snapshots import queued_words

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        carried = os.open(os.devnull, os.O_RDONLY)
        before = len(os.listdir("/proc/self/fd"))
        for data in (b'{"first": 1}', b"not json", b"[" * 100_000, b"", b'{"last": 2}'):
            socket.send_fds(theirs, [data], [carried, carried])
        os.close(carried)
        assert queued_words(ours) == [{"first": 1}, {"last": 2}]
        assert len(os.listdir("/proc/self/fd")) == before - 1  # the ten received descriptors are closed
        for number in range(5):
            theirs.send(json.dumps(number).encode())
        assert queued_words(ours, limit=2) == [0, 1]  # a sender that never stops is read only so far
        assert queued_words(ours) == [2, 3, 4]
        assert queued_words(ours) == []  # nothing queued: no wait
        theirs.send(b'"after"')
        theirs.close()
        assert queued_words(ours, timeout=5) == ["after"]  # and end of file ends the reading


def test_queued_words_reads_a_bounded_part_of_each_word_and_of_all(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process of the cell's that sent 1 MiB words of empty JSON objects while the keeper read made it parse and
    # hold 25 MB for each, up to MAX_QUEUED_WORDS of them: 40 such words took its peak from 39 MB to 1 GB.
    import socket

    from cellbox.sandbox import snapshots

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        # A send buffer a word longer than MAX_WORD fits in (socket(7): the kernel doubles what is asked, up to
        # twice wmem_max, whose default is 208 KiB).
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * snapshots.MAX_WORD)
        theirs.send(b'"' + b"a" * snapshots.MAX_WORD + b'"')  # longer than a word: cut, so not JSON
        theirs.send(b'"short"')
        assert snapshots.queued_words(ours) == ["short"]
        monkeypatch.setattr(snapshots, "MAX_QUEUED_BYTES", 20)
        for number in range(6):
            theirs.send(b"%d" % (10**8 + number))  # 9 bytes each
        assert snapshots.queued_words(ours) == [10**8, 10**8 + 1, 10**8 + 2]  # past 20 bytes, the reading stops
        assert snapshots.queued_words(ours) == [10**8 + 3, 10**8 + 4, 10**8 + 5]


def test_words_queued_on_a_stopped_snapshots_socket_are_not_its_reply_to_a_fork() -> None:
    # A process of the run a snapshot came from sent words on its socket after the keeper's last read, until the
    # run's end killed it: the keeper took the first of them for the snapshot's reply to the next fork, and
    # dropped the snapshot (or took the process it named for the run's command).
    import json
    import os
    import signal
    import socket

    from cellbox.sandbox.snapshots import Snapshot, receive, send_json, stop_process

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            receive(theirs)  # stopped by the keeper's stop_process below, here or before
            send_json(theirs, {"pid": os.getpid()})  # a snapshot's reply: the command it forked, here itself
            signal.pause()
        finally:
            os._exit(0)
    try:
        assert stop_process(pid) is None
        for word in ({"pid": 1}, {"pid": os.getpid()}, "stale"):
            theirs.send(json.dumps(word).encode())
        theirs.close()
        assert Snapshot(pid, ours).fork({"op": "run"}, [], set()) == pid
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ours.close()


def test_a_record_lock_a_cell_took_does_not_hold_the_file_against_the_next_cell(kc: BlockingKernelClient) -> None:
    # As under ipykernel (one process holds the lock and may take it again) and the copy's way (the cell's
    # process ended, and its lock with it): the next cell locks the file at once.
    ok(kc, "import fcntl\nheld = open('held.txt', 'w')\nfcntl.lockf(held, fcntl.LOCK_EX)")
    again = (
        "import fcntl\nwith open('held.txt', 'w') as f:\n"
        "    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nprint('locked')"
    )
    assert ok(kc, again) == "locked\n"


RECORD_LOCKS = """
import fcntl, os, struct, sys
from cellbox.sandbox import snapshots

def held():
    names = os.listdir("/proc/self/fd")
    fast = snapshots._holds_record_locks(names)
    assert fast == snapshots._holds_record_locks_machine_wide(os.getpid()), "fdinfo and /proc/locks disagree"
    return fast

seen = [held()]
whole = open(sys.argv[1] + "/flock.txt", "w")
fcntl.flock(whole, fcntl.LOCK_EX)  # the open file's: a fork shares it
shared = open(sys.argv[1] + "/ofd.txt", "w")
fcntl.fcntl(shared, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
seen.append(held())
record = open(sys.argv[1] + "/record.txt", "w")
fcntl.lockf(record, fcntl.LOCK_EX, 10, 5)  # the process's, a byte range
seen.append(held())
# Listed through either fd of the open file; closing any fd of the file lets the process's locks go (fcntl(2)).
copy = os.dup(record.fileno())
seen.append(held())
os.close(copy)
seen.append(held())
print(seen)
"""


def test_record_locks_are_read_from_the_processs_own_fds(tmp_path: Path) -> None:
    # /proc/self/fdinfo lists the locks of each fd (proc(5), Linux 4.1): the same answer as /proc/locks,
    # read without walking every lock of the machine.  Only fcntl(2) record locks count: fork does not copy them.
    result = subprocess.run(
        [sys.executable, "-c", RECORD_LOCKS, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[False, False, True, True, False]\n"


SHARED_MAPPINGS = r"""
import errno, mmap, os, sys
from multiprocessing import shared_memory
from cellbox.sandbox import snapshots

def both():
    listed = sorted(snapshots._listed_shared_mappings())
    try:
        queried = sorted(snapshots._queried_shared_mappings())
    except OSError as exc:
        assert exc.errno in (errno.ENOTTY, errno.EINVAL), exc  # no PROCMAP_QUERY before Linux 6.11
        queried = listed
    assert queried == listed, (queried, listed)
    return snapshots.shared_mappings()

before = both()
anonymous = mmap.mmap(-1, 3 * mmap.PAGESIZE)  # MAP_SHARED: "/dev/zero (deleted)"
posix = shared_memory.SharedMemory(create=True, size=5 * mmap.PAGESIZE)
fd = os.memfd_create("cellbox-test")
os.ftruncate(fd, 7 * mmap.PAGESIZE)
memfd = mmap.mmap(fd, 7 * mmap.PAGESIZE)
path = os.path.join(sys.argv[1], "odd\nname")  # maps shows the newline as \012
with open(path, "wb") as f:
    f.write(b"x" * 2 * mmap.PAGESIZE)
with open(path, "r+b") as f:
    deleted = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE)
os.unlink(path)
private = mmap.mmap(-1, 11 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)  # not shared: not counted
after = both()
grown = {name for name in after["names"] if name not in before["names"]}
print(after["count"] - before["count"], (after["bytes"] - before["bytes"]) // mmap.PAGESIZE)
print(sorted(name.replace(posix.name.lstrip("/"), "NAME").replace(sys.argv[1], "DIR") for name in grown))
posix.close()
posix.unlink()
"""


def test_shared_mappings_are_found_by_the_query_as_maps_lists_them(tmp_path: Path) -> None:
    # PROCMAP_QUERY (Linux 6.11) asks for the shared mappings alone; the text of /proc/self/maps lists them all.
    # Both must give the same mappings, names included, and only MAP_SHARED ones of shared memory count.
    result = subprocess.run(
        [sys.executable, "-c", SHARED_MAPPINGS, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "4 17"
    assert lines[1] == str(
        sorted(["/dev/zero (deleted)", "/dev/shm/NAME", "/memfd:cellbox-test (deleted)", "DIR/odd\\012name (deleted)"])
    )


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_cells_are_their_own_snapshots_where_bubblewrap_cannot_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A container's seccomp profile: bwrap fails.  As root the filter then refuses chmod(2), which broke the
    session's warm start (IPython's profile README), and the shell built by the first cell kept every cell a copy."""
    fake = tmp_path_factory.mktemp("fake-bwrap")
    (fake / "bwrap").write_text(
        '#!/bin/sh\necho "bwrap: Creating new namespace failed: Operation not permitted" >&2\nexit 1\n'
    )
    (fake / "bwrap").chmod(0o755)
    notebook = tmp_path_factory.mktemp("notebook")
    notebook.chmod(0o755)
    env = ["/usr/bin/env", f"PATH={fake}:{os.environ['PATH']}"]
    with running_kernel("cellbox", cwd=str(notebook), prefix=env) as (_km, client):
        first = execute(client, "import os\nme = os.getpid()")
        assert first.status == "ok" and "bubblewrap" in first.notes, first.notes  # the layers it lacks, said
        for _ in range(2):  # the first cell (which may have built the shell) and one after it
            assert ok(client, LOOK) == "cellbox-snap T 0 1\n"
            ok(client, "me = os.getpid()")


# The end of a cell that becomes its own snapshot, in a fresh process (argv[1] "refused": its sibling fork fails):
# the word it sends once the spare is forked, the name and CPU limit it stops with, what the spare keeps, and the
# way back when the fork is refused.  Prints one JSON object.
OWN_END = r"""
import json, os, resource, signal, socket, sys
from cellbox.sandbox import atfork, snapshots
snapshots.TID_OFFSET = snapshots.find_tid_offset()
atfork.at_base = atfork.registered
refuse = sys.argv[1] == "refused"
keeper_end, snap_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
spare_keeper, spare_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
report_r, report_w = os.pipe()
inode = os.fstat(snap_end.fileno()).st_ino
cell = os.fork()
if cell == 0:
    keeper_end.close(); spare_keeper.close(); os.close(report_r)
    # Above the fds the end closes (0 to 2, and the channel's 3 and 4), as a cell's are.
    fd, spare_fd, report = os.dup2(snap_end.fileno(), 200), os.dup2(spare_end.fileno(), 201), os.dup2(report_w, 202)
    snap_end.close(); spare_end.close(); os.close(report_w)
    resource.setrlimit(resource.RLIMIT_CPU, (50, 60))
    snapshots.set_name(b"cell-command")
    if refuse:
        def refused():
            raise OSError(11, "Resource temporarily unavailable")
        snapshots.sibling_fork = refused
    got = snapshots.become_own_snapshot(fd, spare_fd)
    mine = []
    for n in os.listdir("/proc/self/fd"):
        try:
            mine.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:
            pass  # the listing's own fd
    facts = {
        "got": got[0] if got else None,
        "parent": os.getppid(),
        "name": open("/proc/self/comm").read().strip(),
        "cpu": list(resource.getrlimit(resource.RLIMIT_CPU)),
        "holds_snapshot_socket": f"socket:[{inode}]" in mine,
    }
    os.write(report, (json.dumps(facts) + "\n").encode())
    os._exit(0)
os.close(report_w); snap_end.close(); spare_end.close()
facts = {"me": os.getpid(), "cell": cell}
reports = os.fdopen(report_r)
if refuse:
    facts["cell_report"] = json.loads(reports.readline())
else:
    _pid, status = os.waitpid(cell, os.WUNTRACED)
    facts["stopped"] = os.WIFSTOPPED(status)
    facts["word"] = json.loads(keeper_end.recv(65536))
    facts["snapshot_name"] = open(f"/proc/{cell}/comm").read().strip()
    cpu = next(line for line in open(f"/proc/{cell}/limits") if line.startswith("Max cpu time"))
    facts["snapshot_cpu"] = cpu.split()[3:5]
    facts["spare_report"] = json.loads(reports.readline())
    os.kill(cell, signal.SIGKILL)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
print(json.dumps(facts))
"""


def own_end(way: str) -> dict:
    done = subprocess.run([sys.executable, "-c", OWN_END, way], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_an_own_snapshot_names_its_spare_and_stops_as_a_snapshot_and_its_spare_keeps_no_end_of_its_socket() -> None:
    facts = own_end("forked")
    assert facts["stopped"]
    word = facts["word"]
    spare = word.pop("spare")
    assert word == {"event": "snapshot", "pid": facts["cell"], "shared": word["shared"]}
    assert isinstance(spare, int) and spare not in (0, facts["cell"], facts["me"])
    # The spare is the keeper's child (here, the script's), holds no copy of the snapshot's socket (the snapshot
    # made its own before the fork), and starts from the snapshot's limits, which its run sets (apply_limits).
    report = facts["spare_report"]
    assert report.pop("cpu")[1] == 60
    assert report == {"got": "spare", "parent": facts["me"], "name": "cellbox-snap", "holds_snapshot_socket": False}
    # The snapshot counts the cell's CPU time to its hard limit only, under the snapshot's name.
    assert facts["snapshot_name"] == "cellbox-snap"
    assert facts["snapshot_cpu"] == ["60", "60"]


@pytest.mark.skipif(not OWN_WAY, reason="no sibling fork (clone with CLONE_PARENT) on this machine")
def test_an_end_whose_sibling_fork_is_refused_takes_the_copys_way_with_its_name_and_cpu_limit_as_they_were() -> None:
    facts = own_end("refused")
    assert facts["cell_report"] == {
        "got": None,
        "parent": facts["me"],
        "name": "cell-command",
        "cpu": [50, 60],
        "holds_snapshot_socket": True,  # its own end, which make_snapshot names its children on
    }
