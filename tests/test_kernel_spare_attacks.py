"""A hostile cell against the session's snapshots and its spare: attacks that once broke a promise of docs/session.md.

Each test is a cell a student can write in the default configuration (isolation auto, start method
forkserver, carry_state on), driven through jupyter_client, and states the promise it checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernelkit import execute, running_kernel


@pytest.fixture
def notebook(tmp_path: Path) -> Iterator[tuple[BlockingKernelClient, Path]]:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        yield kc, tmp_path


def ok(kc: BlockingKernelClient, code: str) -> str:
    """Run ``code``, assert it succeeded, return its stdout."""
    result = execute(kc, code)
    assert result.status == "ok", (code, result.errors, result.stream("stderr"))
    return result.stream()


def growth(path: Path, seconds: float) -> int:
    """Bytes ``path`` grew by in ``seconds``, while no cell runs."""
    before = path.stat().st_size if path.exists() else 0
    time.sleep(seconds)
    return (path.stat().st_size if path.exists() else 0) - before


# A cell leaves a signal handler in its snapshot; a later cell continues that snapshot (same Landlock
# domain, so SIGCONT and SIGUSR1 reach it) and the handler runs there, outside every run.
LEAVE_HANDLER = """
import signal, time
def _between(*_args):
    while True:
        with open('between.txt', 'a') as f:
            f.write('.')
        time.sleep(0.02)
signal.signal(signal.SIGUSR1, _between)
"""

WAKE_SNAPSHOT = """
import os, signal
stopped = []
for name in os.listdir('/proc'):
    if name.isdigit() and int(name) != os.getpid():
        try:
            with open(f'/proc/{name}/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        if state == 'T':
            stopped.append(int(name))
for pid in sorted(stopped)[1:]:  # every snapshot but the base (the oldest), which has no handler
    # SIGUSR1 first: it waits, pending, in the stopped process; SIGCONT then runs its handler. The other way
    # round the keeper may kill the continued snapshot before SIGUSR1 is sent (ProcessLookupError).
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGCONT)
print('woken')
"""


def test_a_signal_handler_left_in_a_snapshot_does_not_run_between_cells(
    notebook: tuple[BlockingKernelClient, Path],
) -> None:
    # Promise: "a snapshot is stopped while no cell runs, so between cells the file does not grow".
    # The keeper kills a snapshot someone else continued; the next cell says its state is gone.
    kc, where = notebook
    ok(kc, LEAVE_HANDLER)
    assert ok(kc, WAKE_SNAPSHOT) == "woken\n"
    time.sleep(0.5)
    assert growth(where / "between.txt", 1.0) == 0
    after = execute(kc, "print('after')")
    assert after.stream() == "after\n"
    assert "continued from outside the session" in after.notes
    assert after.stream("stderr") == ""


def test_a_carried_cell_under_a_memory_limit_below_the_session_is_told_its_memory_limit(
    notebook: tuple[BlockingKernelClient, Path],
) -> None:
    # Promise (session.py): "A carried cell holds the session's state too: a limit below it is that cell's
    # memory_limit", with the state before it kept.
    kc, _where = notebook
    ok(kc, "x = 1")
    result = execute(kc, "%%limits memory=100M\ny = 2")
    assert [error["ename"] for error in result.errors] == ["CellMemoryLimitError"]
    assert ok(kc, "print(x)") == "1\n"
