"""The session's snapshots: state crosses cells as process images, kept as under ipykernel, and out of reach.

Grouped by what a notebook does: big data, module state, objects no pickle
carries, cells that fail or are stopped, ``%undo``; then what a cell must not
reach in the default configuration (the kernel process, its connection file,
the runtime directory), tried as a hostile student would.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from cellbox.kernel.kernel import DISCARDED
from kernelkit import alive, descendants, execute, kernel_manager, plain, running_kernel

np = pytest.importorskip("numpy")

SECRET = "cellbox-test-secret-4471"


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelManager, BlockingKernelClient, Path]]:
    notebook = tmp_path_factory.mktemp("notebook")
    os.chmod(notebook, 0o755)
    os.environ["CELLBOX_TEST_SECRET"] = SECRET  # in the kernel's environment, as a token would be
    try:
        with running_kernel("cellbox", cwd=str(notebook)) as (km, client):
            yield km, client, notebook
    finally:
        os.environ.pop("CELLBOX_TEST_SECRET", None)


@pytest.fixture
def kc(session: tuple[KernelManager, BlockingKernelClient, Path]) -> BlockingKernelClient:
    return session[1]


def ok(kc: BlockingKernelClient, code: str) -> str:
    """Run ``code``, assert it succeeded, return its stdout."""
    result = execute(kc, code)
    assert result.status == "ok", (code, result.errors, result.stream("stderr"))
    return result.stream()


# --------------------------------------------------------------------------- big data


def test_a_91_mib_array_and_a_small_name_beside_it_reach_the_next_cell(kc: BlockingKernelClient) -> None:
    ok(kc, "import numpy as np\ndata = np.random.rand(12_000_000); small = 42")
    assert ok(kc, "print(small, data.nbytes)") == "42 96000000\n"


@pytest.mark.slow
def test_a_1_gib_array_is_carried_and_the_snapshot_size_is_in_the_metadata(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.memory=3G"]) as (_km, kc):
        define = execute(kc, "import numpy as np\nbig = np.ones(2**30 // 8)")
        assert define.status == "ok", define.errors
        assert define.metadata["cellbox"]["snapshot"]["rss"] >= 2**30
        assert ok(kc, "print(big.nbytes, big[-1])") == f"{2**30} 1.0\n"


def test_the_reply_says_whether_the_state_was_kept_how_deep_and_how_big(tmp_path: Path) -> None:
    # The keeper's exit record carries what the settle gives either way; the kernel replies without waiting.
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.undo_depth=1"]) as (_km, kc):
        facts = [execute(kc, code).metadata["cellbox"]["snapshot"] for code in ("a = 1", "b = bytearray(64 * 2**20)")]
        stopped = execute(kc, "%%limits wall=1\nimport time\ntime.sleep(30)")
        after = execute(kc, "c = 3")
        assert [(f["kept"], f["depth"]) for f in facts] == [(True, 1), (True, 2)]
        assert facts[1]["rss"] - facts[0]["rss"] >= 60 * 2**20
        assert stopped.status == "error"
        dropped = stopped.metadata["cellbox"]["snapshot"]
        assert (dropped["kept"], dropped["depth"]) == (False, 2)
        assert dropped["rss"] >= 64 * 2**20  # the state that stays: the second cell's
        later = after.metadata["cellbox"]["snapshot"]
        assert (later["kept"], later["depth"]) == (True, 2)
        assert execute(kc, "%undo").stream().startswith("Undid 1 cell")
        assert ok(kc, "print(a, 'b' in dir(), 'c' in dir())") == "1 True False\n"


def test_a_cell_stopped_by_a_limit_after_a_big_one_leaves_the_big_one_intact(kc: BlockingKernelClient) -> None:
    ok(kc, "import numpy as np\nkeep = np.arange(5_000_000)")
    stopped = execute(kc, "%%limits wall=1\nkeep = None\nimport time\ntime.sleep(30)")
    assert stopped.status == "error"
    assert stopped.errors[-1]["ename"] == "CellTimeoutError"
    assert plain(stopped.errors[-1]["traceback"][-1]) == DISCARDED
    assert ok(kc, "print(int(keep[-1]))") == "4999999\n"


# --------------------------------------------------------------------------- module state


def test_a_numpy_seed_set_in_one_cell_gives_the_same_numbers_in_the_next(kc: BlockingKernelClient) -> None:
    expected = np.random.RandomState(20642300).randint(0, 1000, 3)
    ok(kc, "import numpy as np\nnp.random.seed(20642300)")
    assert ok(kc, "print(np.random.randint(0, 1000, 3).tolist())") == f"{expected.tolist()}\n"


def test_a_python_random_seed_set_in_one_cell_gives_the_same_numbers_in_the_next(kc: BlockingKernelClient) -> None:
    # The random module reseeds itself in every child of a fork (os.register_at_fork); the snapshot, the
    # spare and a run forked from a snapshot are such children, and must keep the cell's sequence.
    import random

    expected = random.Random(20642300)
    ok(kc, "import random\nrandom.seed(20642300)")
    first = [expected.random() for _ in range(2)]
    assert ok(kc, "print([random.random() for _ in range(2)])") == f"{first}\n"
    assert ok(kc, "print(random.random())") == f"{expected.random()}\n"
    # A cell that was stopped leaves the state before it: the next run is forked from that snapshot.
    assert execute(kc, "%%limits wall=1\nrandom.random()\nimport time\ntime.sleep(5)").status == "error"
    assert ok(kc, "print(random.random())") == f"{expected.random()}\n"


def test_sys_path_appended_in_one_cell_finds_a_module_in_the_next(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    _km, kc, notebook = session
    src = notebook / "src"
    src.mkdir(exist_ok=True)
    (src / "utils_snap.py").write_text("def greet(name):\n    return f'hello {name}'\n")
    ok(kc, "import sys\nsys.path.append('src')")
    assert ok(kc, "from utils_snap import greet\nprint(greet('ada'))") == "hello ada\n"


def test_module_settings_hold_in_later_cells(kc: BlockingKernelClient) -> None:
    pytest.importorskip("matplotlib")
    ok(
        kc,
        "import numpy as np\nimport matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (3, 2)\n"
        "np.set_printoptions(precision=2)",
    )
    assert ok(kc, "print(np.array([1/3]), plt.figure().get_size_inches().tolist())") == "[0.33] [3.0, 2.0]\n"


def test_a_view_shares_memory_with_its_array_across_cells(kc: BlockingKernelClient) -> None:
    ok(kc, "import numpy as np\na = np.zeros(3); v = a[:2]")
    result = execute(kc, "v[0] = 5; a")
    assert result.of("execute_result")[0]["data"]["text/plain"] == "array([5., 0., 0.])"


def test_a_value_that_pickles_but_cannot_be_unpickled_wipes_nothing(kc: BlockingKernelClient) -> None:
    pytest.importorskip("matplotlib")
    ok(kc, "from matplotlib import rcParamsDefault\nx_kept = 1")
    assert ok(kc, "print(x_kept, len(rcParamsDefault) > 10)") == "1 True\n"


# --------------------------------------------------------------------------- objects no pickle carries


def test_a_generator_a_lock_and_a_lambda_are_carried_as_they_are(kc: BlockingKernelClient) -> None:
    ok(kc, "import threading\ngen = (i * i for i in range(5))\nlock = threading.Lock()\nsq = lambda v: v * v")
    ok(kc, "next(gen)")
    assert ok(kc, "print(next(gen), lock.acquire(blocking=False), sq(7))") == "1 True 49\n"
    assert ok(kc, "print(next(gen), lock.locked())") == "4 True\n"


def test_an_open_file_is_the_same_file_and_its_writes_reach_the_disk(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    _km, kc, notebook = session
    ok(kc, "f = open('carried.txt', 'w+')\nf.write('first ')")
    ok(kc, "f.write('second'); f.flush()")
    assert (notebook / "carried.txt").read_text() == "first second"


# --------------------------------------------------------------------------- cells that fail or are stopped


def test_names_defined_before_an_exception_are_kept_as_under_ipykernel(kc: BlockingKernelClient) -> None:
    failed = execute(kc, "import json as json_before\nbefore_error = 5\n1 / 0\nafter_error = 6")
    assert failed.status == "error" and failed.errors[-1]["ename"] == "ZeroDivisionError"
    assert ok(kc, "print(before_error, json_before.dumps([1]), 'after_error' in dir())") == "5 [1] False\n"


def test_a_cell_ending_its_process_early_is_an_error_and_keeps_nothing(kc: BlockingKernelClient) -> None:
    ok(kc, "early = 'before'")
    ended = execute(kc, "early = 'changed'\nimport os\nif True:\n    os._exit(0)\nprint('never')")
    assert ended.status == "error"
    assert ended.errors[-1]["ename"] == "CellExitedError"
    assert ok(kc, "print(early)") == "before\n"


def test_an_interrupt_that_needed_a_kill_discards_the_cell(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.interrupt_grace=0.3"]) as (km, kc):
        ok(kc, "mark = 'kept'")
        code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nmark = 'lost'\nprint('started')\n"
        interrupted = execute(kc, code + "time.sleep(30)", during=_interrupt_when_started(km))
        assert interrupted.content["evalue"] == "the cell was interrupted"
        assert ok(kc, "print(mark)") == "kept\n"


def test_an_interrupt_the_cell_stops_at_keeps_what_it_did_before(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    km, kc, _notebook = session  # the interrupt is one the kernel lives on: the module's kernel will do
    code = "import time\ninterrupted_mark = 'changed'\nprint('started')\ntime.sleep(30)"
    interrupted = execute(kc, code, during=_interrupt_when_started(km))
    assert interrupted.content["ename"] == "KeyboardInterrupt"
    assert ok(kc, "print(interrupted_mark)") == "changed\n"


def _interrupt_when_started(km: KernelManager) -> Callable[[dict[str, Any]], None]:
    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            threading.Timer(0.3, km.interrupt_kernel).start()

    return during


# --------------------------------------------------------------------------- %undo


def test_undo_puts_the_names_back_to_before_the_last_cells(kc: BlockingKernelClient) -> None:
    ok(kc, "step = 1")
    ok(kc, "step = 2")
    ok(kc, "step = 3\nextra = True")
    undone = execute(kc, "%undo 2")
    assert undone.status == "ok"
    assert "Undid 2 cells" in undone.stream() and "Files written and output shown stay" in undone.stream()
    assert ok(kc, "print(step, 'extra' in dir())") == "1 False\n"


def test_undo_with_a_bad_count_is_a_usage_error(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%undo many")
    assert result.status == "error" and result.content["ename"] == "UsageError"


def test_undo_goes_back_no_further_than_the_kept_snapshots(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.undo_depth=1"]) as (_km, kc):
        for n in range(4):
            ok(kc, f"depth_mark = {n}")
        undone = execute(kc, "%undo 3")
        assert "Undid 1 cell" in undone.stream() and "(Only 1 cell could be undone;" in undone.stream()
        assert ok(kc, "print(depth_mark)") == "2\n"


# --------------------------------------------------------------------------- the kernel out of a cell's reach


def test_default_isolation_is_auto_with_the_session_inside_it(kc: BlockingKernelClient) -> None:
    result = execute(kc, "pass")
    isolation = result.metadata["cellbox"]["isolation"]
    assert "forkserver" in isolation
    assert {"pid", "landlock"} <= set(isolation) or result.metadata["cellbox"]["notes"]


def test_a_cell_cannot_read_the_kernels_environment_or_memory(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    km, kc, _notebook = session
    pid = int(km.provisioner.process.pid)  # type: ignore[union-attr]
    probe = f"""
import glob
found = []
for path in glob.glob('/proc/*/environ') + ['/proc/{pid}/environ', '/proc/{pid}/mem']:
    try:
        with open(path, 'rb') as f:
            if b'{SECRET}' in f.read(1 << 20):
                found.append(path)
    except OSError:
        pass
print(found)
"""
    assert ok(kc, probe) == "[]\n"


def test_a_cell_cannot_signal_or_trace_the_kernel(session: tuple[KernelManager, BlockingKernelClient, Path]) -> None:
    km, kc, _notebook = session
    pid = int(km.provisioner.process.pid)  # type: ignore[union-attr]
    attack = f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
traced = libc.ptrace(16, {pid}, 0, 0)  # PTRACE_ATTACH
try:
    os.kill({pid}, signal.SIGKILL)
    killed = 'sent'
except OSError as exc:
    killed = type(exc).__name__
print(traced, killed)
"""
    out = ok(kc, attack)
    assert out.split()[0] == "-1"
    assert km.is_alive()
    os.kill(pid, 0)  # still there
    assert ok(kc, "print('alive')") == "alive\n"


def test_a_cell_cannot_read_the_connection_file_or_the_runtime_directory(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    km, kc, _notebook = session
    from jupyter_core.paths import jupyter_runtime_dir

    connection = km.connection_file
    attack = f"""
import os
found = []
for path in ({connection!r}, {jupyter_runtime_dir()!r}):
    try:
        if os.path.isdir(path):
            found += [name for name in os.listdir(path) if name.endswith('.json')]
        else:
            found.append(open(path).read()[:20])
    except OSError:
        pass
print(found)
"""
    assert ok(kc, attack) == "[]\n"


def test_a_daemon_left_by_a_cell_does_not_outlive_it_nor_become_the_state(kc: BlockingKernelClient) -> None:
    ok(kc, "daemon_mark = 'before'")
    code = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        daemon_mark = 'daemon'
        time.sleep(60)
    os._exit(0)
daemon_mark = 'cell'
"""
    result = execute(kc, code)
    assert result.status == "ok"
    assert result.metadata["cellbox"]["killed_processes"] >= 1
    assert ok(kc, "print(daemon_mark)") == "cell\n"


def test_work_a_cell_leaves_in_its_snapshot_does_not_run_between_cells(
    session: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    # A thread started in every forked child (so in each snapshot too) ticks into a file;
    # a snapshot is stopped while no cell runs, so between cells the file does not grow.
    _km, kc, notebook = session
    code = """
import os, threading, time
def tick():
    time.sleep(0.2)  # past the fork's own work: a snapshot that ran would tick from here on
    while True:
        with open('ticks.txt', 'a') as f:
            f.write('.')
        time.sleep(0.01)
os.register_at_fork(after_in_child=lambda: threading.Thread(target=tick, daemon=True).start())
"""
    ok(kc, code)
    ok(kc, "pass")  # its snapshot was forked with the handler: a ticking thread in it
    ticks = notebook / "ticks.txt"
    before = ticks.stat().st_size if ticks.exists() else 0
    import time

    time.sleep(1.0)
    assert (ticks.stat().st_size if ticks.exists() else 0) == before


def test_carry_state_false_gives_every_cell_a_fresh_namespace(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.carry_state=False"]) as (_km, kc):
        ok(kc, "fresh_mark = 1")
        assert execute(kc, "fresh_mark").errors[-1]["ename"] == "NameError"


def test_shutdown_ends_every_process_of_the_session(tmp_path: Path) -> None:
    km = kernel_manager("cellbox")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        ok(kc, "import os\nsession_pid = os.getpid()")
        kernel_pid = int(km.provisioner.process.pid)  # type: ignore[union-attr]
        below = descendants(kernel_pid)
        assert below
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert [pid for pid in below if alive(pid)] == []


# --------------------------------------------------------------------------- a hostile cell against the session

FORGE_REPLY = """
import json, os, sys
_forged = {forged!r}
def _forge():
    global _forged
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fork_run" and "sock" in frame.f_locals and _forged is not None:
            frame.f_locals["sock"].send(json.dumps({{"pid": _forged}}).encode())
            _forged = None
            return
        frame = frame.f_back
os.register_at_fork(after_in_parent=_forge)
"""


@pytest.mark.parametrize("forged", ["decoy", "not-a-number", 1])
def test_a_snapshot_that_forges_its_reply_kills_nothing_and_breaks_no_session(tmp_path: Path, forged: object) -> None:
    import subprocess

    decoy = subprocess.Popen(["sleep", "60"])
    try:
        with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
            ok(kc, "kept_name = 'here'")
            ok(kc, FORGE_REPLY.format(forged=decoy.pid if forged == "decoy" else forged))
            hit = execute(kc, "%%limits wall=2\nprint('next cell')")
            assert hit.stream() == "next cell\n"
            assert km.is_alive()
            assert ok(kc, "print(kept_name)") == "here\n"
        assert decoy.poll() is None  # the host process the snapshot named is alive
    finally:
        decoy.kill()
        decoy.wait()


WRITE_SNAPSHOTS = """
import ctypes, os
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
ulong = ctypes.c_ulong
libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ulong, ctypes.c_void_p, ulong, ulong]
buf = ctypes.create_string_buffer(b"grade=A", 7)
address = ctypes.addressof((ctypes.c_char * len(flag)).from_buffer(flag))
written = []
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) != os.getpid():
        local, remote = iovec(ctypes.addressof(buf), 7), iovec(address, 7)
        if libc.process_vm_writev(int(name), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 7:
            written.append(name)
print(written)
"""


def test_a_cell_cannot_write_into_the_snapshots_of_other_cells(kc: BlockingKernelClient) -> None:
    ok(kc, "flag = bytearray(b'grade=F')")
    ok(kc, "other = 1")
    assert ok(kc, WRITE_SNAPSHOTS) == "[]\n"
    undone = execute(kc, "%undo 1")
    assert undone.status == "ok"
    assert ok(kc, "print(flag)") == "bytearray(b'grade=F')\n"


HEARTBEAT = """
import os, time
_started = False
def _beat():
    global _started
    if _started:
        return
    _started = True
    if os.fork() == 0:
        os.setsid()
        while True:
            with open('heartbeat.txt', 'a') as f:
                f.write('.')
            time.sleep(0.05)
os.register_at_fork(after_in_child=_beat)
"""


def test_a_process_a_snapshot_forks_for_a_cell_dies_with_that_cell(tmp_path: Path) -> None:
    import time

    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        ok(kc, HEARTBEAT)
        ok(kc, "pass")
        ok(kc, "pass")
        beats = tmp_path / "heartbeat.txt"
        before = beats.stat().st_size if beats.exists() else 0
        time.sleep(1.0)
        assert (beats.stat().st_size if beats.exists() else 0) == before
