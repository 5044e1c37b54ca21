"""A hostile notebook against a cell's exit path: its snapshot and spare, its limits, its reply, the shutdown.

When a cell finishes, its command forks the next snapshot and the next spare, names them to the keeper
and exits; the keeper stops both before it reports the run, and the kernel replies without waiting for
the settle.  Each test is a cell a student can write, driven through jupyter_client against the
``cellbox`` kernel.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from kernelkit import alive, descendants, execute, kernel_manager, running_kernel

# Each test starts a kernel of its own for a hostile notebook and waits out a limit: heavy, left to CI and -m slow.
pytestmark = pytest.mark.slow


@pytest.fixture
def notebook(tmp_path: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient, Path]]:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        yield km, kc, tmp_path


def ok(kc: BlockingKernelClient, code: str, timeout: float = 60) -> str:
    result = execute(kc, code, timeout=timeout)
    assert result.status == "ok", (code, result.errors, result.stream("stderr"))
    return result.stream()


def stamps_after(path: Path, moment: float) -> list[float]:
    """Timestamps (one a line) written to ``path`` after ``moment``."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().split():
        try:
            found.append(float(line))
        except ValueError:
            continue
    return [stamp for stamp in found if stamp > moment]


# --------------------------------------------------------------------------- between cells

# An at-fork handler that runs in the new snapshot and spare only (os.fork called from make_snapshot):
# it starts a thread that writes timestamps, and holds the process's main thread for 3 s. Both must be
# stopped before the cell's reply, whatever the handler does.
SNAPSHOT_THREAD = """
import os, sys, threading, time
def _tick():
    while True:
        with open('late.txt', 'a') as f:
            f.write(f'{time.time()}\\n')
        time.sleep(0.02)
def _in_snapshot():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == 'make_snapshot':
            threading.Thread(target=_tick, daemon=True).start()
            time.sleep(3)
            return
        frame = frame.f_back
os.register_at_fork(after_in_child=_in_snapshot)
"""

# The same with a process: the snapshot forks a child (setsid, away from the run's group) that
# writes timestamps, once the keeper has killed the run's other processes.
SNAPSHOT_CHILD = """
import os, sys, time
_done = False
def _in_snapshot():
    global _done
    if _done:
        return
    _done = True
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == 'make_snapshot':
            time.sleep(0.5)  # past the keeper's kill of the run's processes
            if os.fork() == 0:
                os.setsid()
                while True:
                    with open('late.txt', 'a') as f:
                        f.write(f'{time.time()}\\n')
                    time.sleep(0.02)
            time.sleep(2.5)
            return
        frame = frame.f_back
os.register_at_fork(after_in_child=_in_snapshot)
"""


@pytest.mark.parametrize("code", [SNAPSHOT_THREAD, SNAPSHOT_CHILD], ids=["thread", "child"])
def test_nothing_of_a_cell_runs_after_its_reply_while_its_snapshot_forks_the_spare(
    notebook: tuple[KernelManager, BlockingKernelClient, Path], code: str
) -> None:
    _km, kc, where = notebook
    ok(kc, code)
    replied = time.time()
    time.sleep(1.5)
    late = stamps_after(where / "late.txt", replied + 0.2)
    assert late == [], f"{len(late)} timestamps written {max(late) - replied:.2f} s after the reply"


def test_the_next_cell_after_a_slow_snapshot_runs_from_it(
    notebook: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    # Whatever the window, the next cell must come from the right state and no output of the
    # handler's thread may leak into it.
    _km, kc, _where = notebook
    ok(kc, "mark = 'one'")
    ok(kc, SNAPSHOT_THREAD.replace("time.sleep(3)", "time.sleep(1)"))
    ok(kc, "mark = 'two'")
    assert ok(kc, "print(mark)") == "two\n"


# --------------------------------------------------------------------------- the CPU clock

# The wall limit is a guard far past the 6 CPU seconds the three spinners need at most: on a busy machine they
# get those seconds slowly, and the CPU limit must still be what stops the cell.
CPU_BUSY = """%%limits cpu=1 wall=120
import os, signal, time
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
for i in range({children}):
    if os.fork() == 0:
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        last = 0.0
        while True:
            spent = time.process_time()
            if spent - last > 0.05:
                with open(f'cpu-{{os.getpid()}}.txt', 'w') as f:
                    f.write(str(spent))
                last = spent
while True:
    pass
"""


@pytest.mark.parametrize("children", [0, 2])
def test_a_busy_cell_is_stopped_at_its_hard_cpu_limit(
    notebook: tuple[KernelManager, BlockingKernelClient, Path], children: int
) -> None:
    _km, kc, where = notebook
    result = execute(kc, CPU_BUSY.format(children=children), timeout=180)
    assert result.metadata["cellbox"]["status"] == "cpu_limit", result.metadata["cellbox"]
    # Hard limit 2 s of CPU (soft 1 + 1); on 2 shared cores the children share the time.
    spent = [float(p.read_text() or 0) for p in where.glob("cpu-*.txt")]
    assert len(spent) == children
    if not children:
        assert result.metadata["cellbox"]["cpu_time"] <= 2.0 + 0.35, result.metadata["cellbox"]
    assert all(s <= 2.0 + 0.35 for s in spent), spent  # the keeper's clock: within its 0.1 s of the hard limit


# --------------------------------------------------------------------------- the processes limit

FORKS = """%%limits processes=5 wall=20
import os, time
started = []
try:
    for i in range(40):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        started.append(pid)
except OSError:
    pass
print(len(started))
for pid in started:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""

# 20 threads in every snapshot the cell's process forks (and in nothing else: not in the spare it forks
# next, which becomes the next cell's process, whose threads are that cell's own).
SNAPSHOT_THREADS = """
import os, sys, threading, time
def _in_snapshot():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == 'make_snapshot' and frame.f_locals['names']['pid'] is None:
            for _ in range(20):
                threading.Thread(target=time.sleep, args=(10**6,), daemon=True).start()
            return
        frame = frame.f_back
os.register_at_fork(after_in_child=_in_snapshot)
"""

# Kill every stopped process of the session with more than 10 threads (the snapshots the last
# cell left threads in): the pids.max the keeper computed at the run's start counted them.
KILL_FAT_SNAPSHOTS = """
import os, signal
for name in os.listdir('/proc'):
    if name.isdigit() and int(name) != os.getpid():
        try:
            with open(f'/proc/{name}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if fields[0] == 'T' and int(fields[17]) > 10:
            os.kill(int(name), signal.SIGKILL)
"""


def test_the_processes_limit_holds_exactly_with_kept_snapshots_and_threads_in_them(
    notebook: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    _km, kc, _where = notebook
    for i in range(4):
        ok(kc, f"x{i} = {i}")
    assert ok(kc, FORKS) == "5\n"
    ok(kc, SNAPSHOT_THREADS)
    ok(kc, "pass")
    assert ok(kc, FORKS) == "5\n"


@pytest.mark.xfail(
    strict=True,
    reason="pids.max is computed once at the run's start from the chain's thread counts; a cell that kills "
    "a kept snapshot holding threads gets their room (never more than the session held when the run began)",
)
def test_a_cell_that_kills_a_fat_snapshot_gets_no_more_processes(
    notebook: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    _km, kc, _where = notebook
    ok(kc, SNAPSHOT_THREADS)
    ok(kc, "pass")
    # A stopped cell: the next one is forked from the last kept snapshot itself, which finishes its
    # at-fork handler (its 20 threads) before it forks (the keeper stopped it before it had run).
    assert execute(kc, "%%limits wall=1\nimport time\ntime.sleep(5)").content["ename"] == "CellTimeoutError"
    head, body = FORKS.split("\n", 1)
    assert ok(kc, head + "\n" + KILL_FAT_SNAPSHOTS + body) == "5\n"


def test_a_cell_that_uses_its_whole_processes_limit_says_its_state_is_not_kept(
    notebook: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    # Its N children, alive at its end, leave no room in its processes limit for the copy of its process
    # that keeps its state: the cell's own reply stands, one line says what is lost, and the keeper does
    # not wait for a snapshot that cannot come (it used to: 5 s, then "ended before the cell finished").
    _km, kc, _where = notebook
    ok(kc, "kept_mark = 'before'")
    keep_children = FORKS.split("for pid in started")[0] + "kept_mark = 'here'\n"
    result = execute(kc, keep_children)
    assert (result.status, result.stream()) == ("ok", "5\n"), result.errors
    assert result.stream("stderr") == ""
    assert result.notes == (
        "cellbox: what this cell defined is not kept: its process could not be copied (Resource temporarily "
        "unavailable); the next cell sees the names as they were before it\n"
    )
    assert ok(kc, "print(kept_mark)") == "before\n"


# --------------------------------------------------------------------------- shutdown


@pytest.mark.parametrize("when", ["running", "input", "right-after"])
def test_shutdown_ends_every_process_and_the_kernel_exits_on_its_own(tmp_path: Path, when: str) -> None:
    km = kernel_manager("cellbox")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    proc = km.provisioner.process  # type: ignore[union-attr]
    try:
        kc.wait_for_ready(timeout=60)
        ok(kc, "import os\nx = 1")
        if when == "running":
            kc.execute("import time\nwhile True: time.sleep(0.01)")
            time.sleep(1.0)
        elif when == "input":
            kc.execute("input('?')", allow_stdin=True)
            kc.get_stdin_msg(timeout=30)
        else:
            kc.execute("y = 2")
        below = descendants(int(proc.pid))
        assert below
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert proc.returncode == 0, proc.returncode  # not SIGTERM/SIGKILL from jupyter_client
    assert [pid for pid in below if alive(pid)] == []


# --------------------------------------------------------------------------- the keeper's protocol


def test_stopped_cells_back_to_back_leave_the_replies_in_order_and_the_state_right(
    notebook: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    # Every kind of ending right after another (settle replies owed, spares being forked), each
    # followed by a cell whose output says which state it ran from.
    _km, kc, _where = notebook
    ok(kc, "n = 0")
    hostile = [  # an exception keeps the names it set (as under ipykernel); every stopped cell keeps nothing
        "n = 100\nraise ValueError('x')",
        "%%limits wall=1\nn = 200\nimport time\ntime.sleep(5)",
        "%%limits output=1000\nn = 300\nprint('y' * 100000)",
        "n = 400\nimport os\nos._exit(3)",
        "%%limits processes=3 wall=5\nn = 500\nimport os\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "%%limits cpu=1\nn = 600\nwhile True: pass",
    ]
    expected = 100
    for code in hostile:
        execute(kc, code, timeout=60)
        expected += 1
        assert ok(kc, "n += 1\nprint(n)") == f"{expected}\n", code
    execute(kc, "%%limits wall=1\nn = 700\nimport time\ntime.sleep(5)", timeout=60)
    undone = execute(kc, "%undo 1")
    assert undone.status == "ok"
    assert ok(kc, "print(n)") == f"{expected - 1}\n"
