"""Adversarial programs the sandbox core must survive, grouped by threat.

Each test asserts the exact status and, where the program starts processes,
that nothing it started is left running.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cellbox.sandbox import pids_cgroup_root, run
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from sandboxkit import FORK_UNTIL_REFUSED, marker, rss_bytes, run_python, survivors

# --------------------------------------------------------------------------- CPU


# A spinning program's CPU seconds come at the pace the machine gives it (a sixth of a core at a load of 12 on 2
# cores): the wall limit of these tests is only a guard far past what the CPU limit needs, so the CPU limit is
# what ends the run however busy the machine is.
SPIN_GUARD = 120.0  # seconds of wall time


def test_spinning_loop_is_cpu_limit() -> None:
    outcome = run_python("while True: pass", limits=Limits(cpu_time=1, wall_time=SPIN_GUARD))
    assert outcome.status is Status.CPU_LIMIT
    assert outcome.signal == "SIGXCPU"
    # The kernel charges RLIMIT_CPU in scheduler ticks while rusage is exact, so
    # on a busy machine the figure can land a little under the limit.
    assert 0.7 <= outcome.cpu_time < 2.5


def test_spin_that_ignores_sigxcpu_is_killed_at_the_hard_limit() -> None:
    code = """
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True: pass
    """
    outcome = run_python(code, limits=Limits(cpu_time=1, wall_time=SPIN_GUARD))
    assert outcome.status is Status.CPU_LIMIT
    assert outcome.signal == "SIGKILL"
    assert outcome.cpu_time >= 1.6  # soft limit 1 s, hard limit one second more (tick accounting, as above)


# --------------------------------------------------------------------------- wall clock


@pytest.mark.parametrize(
    "code",
    [
        "import time\ntime.sleep(1000)",
        "import os\nr, w = os.pipe()\nos.read(r, 1)",  # a read that never gets data
        "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); s.accept()",
    ],
    ids=["sleep", "blocking-read", "blocking-accept"],
)
def test_hanging_program_is_timed_out_within_a_second_of_the_deadline(code: str) -> None:
    start = time.monotonic()
    outcome = run_python(code, limits=Limits(wall_time=1.5, cpu_time=10))
    elapsed = time.monotonic() - start
    assert outcome.status is Status.TIMED_OUT
    assert 1.5 <= outcome.wall_time < 2.5
    assert elapsed < 2.5
    assert outcome.cpu_time < 1.0  # it burned no CPU: only the wall clock could catch it


# --------------------------------------------------------------------------- memory


def test_list_that_grows_without_end_is_memory_limit() -> None:
    code = """
        chunks = []
        while True:
            chunks.append(bytearray(1024 * 1024))
    """
    outcome = run_python(code, limits=Limits(memory=256 * 1024**2, wall_time=20, cpu_time=20))
    assert outcome.status is Status.MEMORY_LIMIT
    assert "MemoryError" in outcome.stderr
    assert outcome.peak_memory > 150 * 1024**2


def test_one_huge_allocation_is_memory_limit_at_once() -> None:
    outcome = run_python("x = bytearray(64 * 1024**3)", limits=Limits(memory=256 * 1024**2))
    assert outcome.status is Status.MEMORY_LIMIT
    assert outcome.wall_time < 5


def test_memory_error_text_printed_by_a_successful_program_is_not_a_limit() -> None:
    outcome = run_python("print('MemoryError')")
    assert outcome.status is Status.OK


# Starts COUNT threads that wait, as a thread pool or a web server would.
THREADS = """
    import threading
    done = threading.Event()
    threads = [threading.Thread(target=done.wait, daemon=True) for _ in range(COUNT)]
    for thread in threads:
        thread.start()
    done.set()
    print("started", len(threads))
"""


def test_sixty_four_threads_fit_under_256M() -> None:
    # Each thread's stack and malloc arena are reserved under RLIMIT_AS: a
    # default 8 MiB stack and a 64 MiB arena each made this fail after a few.
    outcome = run_python(THREADS.replace("COUNT", "64"), limits=Limits(memory=256 * 1024**2))
    assert outcome.status is Status.OK, outcome.stderr[-500:]
    assert outcome.stdout == "started 64\n"


def test_thread_that_cannot_reserve_its_stack_is_memory_limit_with_a_note() -> None:
    # 2,000 stacks of 2 MiB cannot be reserved under 256M; the processes limit allows them.
    limits = Limits(memory=256 * 1024**2, processes=4000)
    outcome = run_python(THREADS.replace("COUNT", "2000"), limits=limits)
    assert outcome.status is Status.MEMORY_LIMIT, outcome.stderr[-500:]
    assert "can't start new thread" in outcome.stderr
    reserved = "memory: the program could not reserve address space under its 256M limit"
    assert any(note.startswith(reserved) for note in outcome.notes)


def test_jit_that_cannot_reserve_its_code_range_is_memory_limit(
    require_tool: Callable[..., str], tmp_path: Path
) -> None:
    node = require_tool("node", install="apt-get install nodejs")
    script = tmp_path / "hello.js"
    script.write_text('console.log("hello")\n')
    # V8 reserves its code range and heap cage up front and aborts with SIGTRAP
    # when RLIMIT_AS refuses: the memory limit, not a crash.
    outcome = run([node, str(script)], limits=Limits(memory=256 * 1024**2, wall_time=20))
    assert outcome.status is Status.MEMORY_LIMIT, outcome.stderr[-500:]
    assert "Failed to reserve virtual memory" in outcome.stderr
    assert any("under its 256M limit" in note for note in outcome.notes)


def test_thread_refused_by_the_processes_limit_is_not_memory_limit() -> None:
    if pids_cgroup_root() is None:
        pytest.skip("no writable pids cgroup: RLIMIT_NPROC and RLIMIT_AS refuse a thread the same way")
    outcome = run_python(THREADS.replace("COUNT", "64"), limits=Limits(processes=20, memory=1024**3))
    assert outcome.status is Status.ERROR
    assert "processes: the run reached its limit of 20 processes and threads" in outcome.notes


# --------------------------------------------------------------------------- processes


def test_fork_bomb_ends_on_time_and_leaves_no_process() -> None:
    mark = marker()
    code = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    start = time.monotonic()
    outcome = run_python(code, mark, limits=Limits(wall_time=3, cpu_time=10, processes=64, memory=256 * 1024**2))
    assert time.monotonic() - start < 3 + 2
    assert outcome.status in (Status.TIMED_OUT, Status.CPU_LIMIT)
    assert survivors(mark) == []
    # The machine still forks.
    assert subprocess.run(["true"]).returncode == 0


def test_processes_limit_stops_forking() -> None:
    mark = marker()
    outcome = run_python(FORK_UNTIL_REFUSED, mark, limits=Limits(processes=10, wall_time=10))
    assert outcome.status is Status.OK
    assert "stopped after" in outcome.stdout
    started = int(outcome.stdout.split()[2])
    # A pids cgroup counts the command itself; RLIMIT_NPROC counts on top of the
    # user's existing tasks: either way no more than the limit can be started.
    assert 1 <= started <= 10
    assert outcome.killed_processes == started  # the sleepers it left behind were killed
    assert survivors(mark) == []


def test_setsid_daemon_holding_stdout_is_killed_and_does_not_delay_the_result() -> None:
    mark = marker()
    code = """
        import os, time
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:        # double fork: re-parented away from the command
                time.sleep(1000)      # and still holding stdout open
            os._exit(0)
        os.waitpid(child, 0)          # only the daemon is left when the command ends
        print("parent done", flush=True)
    """
    start = time.monotonic()
    outcome = run_python(code, mark, limits=Limits(wall_time=60))
    # Nowhere near the 60 s limit: the run ended with the command, not waiting for the daemon's pipe (how soon
    # after is the machine's pace: Python alone can take seconds to start on a busy one).
    assert time.monotonic() - start < 30
    assert outcome.status is Status.OK
    assert outcome.stdout == "parent done\n"
    assert outcome.killed_processes == 1
    assert survivors(mark) == []


def test_daemon_of_a_hanging_program_dies_with_it_at_the_deadline() -> None:
    mark = marker()
    code = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(1000)
        time.sleep(1000)
    """
    outcome = run_python(code, mark, limits=Limits(wall_time=1))
    assert outcome.status is Status.TIMED_OUT
    assert outcome.wall_time < 2
    assert survivors(mark) == []


def test_multiprocessing_pool_works_under_default_limits() -> None:
    code = """
        import multiprocessing
        def square(n):
            return n * n
        if __name__ == "__main__":
            with multiprocessing.Pool(2) as pool:
                print(sum(pool.map(square, range(100))))
    """
    mark = marker()
    outcome = run_python(code, mark, limits=Limits(wall_time=30))
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "328350\n"
    assert survivors(mark) == []


def test_numpy_imports_and_computes_under_default_limits() -> None:
    pytest.importorskip("numpy")
    code = """
        import numpy as np
        a = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)
        print(int((a @ np.ones(1000)).sum()))
    """
    outcome = run_python(code, limits=Limits(wall_time=30))
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "499999500000\n"


# --------------------------------------------------------------------------- output


def test_flood_on_stdout_and_stderr_is_output_limit_with_bounded_parent_memory() -> None:
    code = """
        import sys
        line = "x" * 1023 + "\\n"
        while True:
            sys.stdout.write(line)
            sys.stderr.write(line)
    """
    before = rss_bytes()
    outcome = run_python(code, limits=Limits(output=100 * 1024, wall_time=10))
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.truncated is True
    kept = len(outcome.stdout.encode()) + len(outcome.stderr.encode())
    assert kept == 100 * 1024
    assert outcome.stdout and outcome.stderr  # both streams were read, not one after the other
    assert rss_bytes() - before < 32 * 1024**2


def test_invalid_utf8_is_decoded_with_replacement() -> None:
    code = r"""
        import sys
        sys.stdout.buffer.write(b"ok \xff\xfe end \xe2\x82")
    """
    outcome = run_python(code)
    assert outcome.status is Status.OK
    assert outcome.stdout == "ok \ufffd\ufffd end \ufffd"


def test_multibyte_character_split_across_reads_is_kept_whole() -> None:
    code = r"""
        import sys, time
        data = "é€😀".encode()
        for i in range(len(data)):
            sys.stdout.buffer.write(data[i:i + 1]); sys.stdout.flush(); time.sleep(0.01)
    """
    chunks: list[str] = []
    outcome = run_python(code, on_stdout=chunks.append)
    assert outcome.stdout == "é€😀"
    assert "".join(chunks) == "é€😀"


def test_output_reaches_the_callback_while_the_child_runs() -> None:
    code = """
        import time
        for i in range(3):
            print(i, flush=True)
            time.sleep(0.3)
    """
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    outcome = run_python(code, on_stdout=lambda text: seen.append((time.monotonic() - start, text)))
    assert outcome.stdout == "0\n1\n2\n"
    first = next(t for t, text in seen if "0" in text)
    last = next(t for t, text in seen if "2" in text)
    assert last - first > 0.4  # each line arrived as it was printed, not at the end


def test_file_written_without_end_stops_at_the_file_size_limit(tmp_path: os.PathLike[str]) -> None:
    code = """
        with open("big.bin", "wb") as f:
            while True:
                f.write(b"x" * 65536)
    """
    outcome = run_python(code, cwd=tmp_path, limits=Limits(file_size=1024**2))
    assert outcome.status is Status.ERROR
    assert "File too large" in outcome.stderr
    assert os.path.getsize(os.path.join(tmp_path, "big.bin")) == 1024**2


# --------------------------------------------------------------------------- crashes


@pytest.mark.parametrize(
    ("code", "signal_name"),
    [
        ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
        ("import os\nos.abort()", "SIGABRT"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
    ],
    ids=["segfault", "abort", "self-sigkill"],
)
def test_crash_is_crashed_with_the_signal_named_not_a_limit(code: str, signal_name: str) -> None:
    outcome = run_python(code)
    assert outcome.status is Status.CRASHED
    assert outcome.signal == signal_name
    assert outcome.exit_code is None


# --------------------------------------------------------------------------- secrets and input


def test_secret_in_the_parent_environment_is_absent_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLBOX_TEST_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("JPY_SESSION_NAME", "secret-notebook")
    code = """
        import os
        print(sorted(os.environ))
        print(open("/proc/self/environ", "rb").read().count(b"hunter2"))
    """
    outcome = run_python(code)
    assert outcome.status is Status.OK
    names_line, count_line = outcome.stdout.splitlines()
    assert "CELLBOX_TEST_SECRET_TOKEN" not in names_line
    assert "JPY_SESSION_NAME" not in names_line
    assert "hunter2" not in outcome.stdout.replace(count_line, "")
    assert count_line == "0"


def test_input_with_no_stdin_fails_at_once() -> None:
    outcome = run_python("input('name? ')", limits=Limits(wall_time=60))
    assert outcome.status is Status.ERROR
    assert "EOFError" in outcome.stderr
    assert outcome.wall_time < 30  # nowhere near the limit: it did not wait for input


def test_stdin_bytes_reach_the_child() -> None:
    outcome = run_python("print(input().upper())", stdin=b"hello\n")
    assert outcome.stdout == "HELLO\n"


def test_processes_stopped_at_the_deadline_are_counted() -> None:
    mark = marker()
    outcome = run(
        ["/bin/sh", "-c", f"sleep 100 & sleep 100 & sleep 100 & wait # {mark}"],
        limits=Limits(wall_time=1),
    )
    assert outcome.status is Status.TIMED_OUT
    assert outcome.killed_processes == 3  # the three sleeps; the command itself is not counted
    assert survivors(mark) == []


def test_daemon_forked_while_the_command_exits_never_stalls_the_run() -> None:
    # The supervisor once stopped looking when one scan of /proc came back empty
    # while a daemon was still being forked and re-parented to it; the run then
    # waited past its deadline.  Racing the command's exit many times catches that.
    mark = marker()
    code = """
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                import time
                time.sleep(1000)
            os._exit(0)
    """
    for _ in range(15):
        outcome = run_python(code, mark, limits=Limits(wall_time=60))
        assert outcome.status is Status.OK
        assert outcome.wall_time < 30  # nowhere near the limit: it did not stall
    assert survivors(mark) == []


@pytest.mark.parametrize("megabytes", [30, 60], ids=["loader-cannot-map", "openblas-gives-up"])
def test_numpy_import_under_a_tight_memory_limit_is_memory_limit(megabytes: int) -> None:
    pytest.importorskip("numpy")
    # Under RLIMIT_AS the loader cannot map OpenBLAS (an ImportError), or
    # OpenBLAS cannot get its buffers and exits with its own message: neither
    # is a MemoryError, and both are the memory limit.
    outcome = run_python("import numpy", limits=Limits(memory=megabytes * 1024**2, wall_time=20))
    assert outcome.status is Status.MEMORY_LIMIT, outcome.stderr[-500:]
