"""Helpers for the sandbox tests: run Python code under limits and find survivors."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid

from cellbox.sandbox import run
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Outcome
from cellbox.sandbox.session import ForkServer

# Set (by test_sandbox_forkserver's fixture) to run every program through a fork server.
FORKSERVER: ForkServer | None = None


# The keys design.md gives an Outcome (its JSON, `cellbox run --json`).
DESIGN_KEYS = frozenset(
    {
        "status",
        "exit_code",
        "signal",
        "wall_time",
        "cpu_time",
        "peak_memory",
        "stdout",
        "stderr",
        "truncated",
        "isolation",
    }
)

# Forks sleepers until the processes limit refuses one, then says how many it started.
FORK_UNTIL_REFUSED = """
import os, time
pids = []
try:
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
except OSError as exc:
    print("stopped after", len(pids), type(exc).__name__)
"""


def marker() -> str:
    """A unique word to put in a child's command line, so its survivors can be found."""
    return f"cellbox-test-{uuid.uuid4().hex}"


def run_python(code: str, mark: str | None = None, **options: object) -> Outcome:
    """Run ``code`` with this interpreter in the sandbox; ``mark`` goes into argv as a comment."""
    source = textwrap.dedent(code)
    if mark:
        source += f"\n# {mark}\n"
    limits = options.pop("limits", None) or Limits(wall_time=10, cpu_time=10, memory=512 * 1024**2)
    if FORKSERVER is None:
        return run([sys.executable, "-c", source], limits=limits, **options)  # type: ignore[arg-type]
    argv = [sys.executable, "-m", "cellbox._testprog", source]
    outcome = run(argv, limits=limits, forkserver=FORKSERVER, **options)  # type: ignore[arg-type]
    assert "forkserver" in outcome.isolation, f"the run was spawned, not forked: {outcome.notes}"
    return outcome


def survivors(mark: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``mark``.

    With a fork server, forked processes keep the server's command line: then
    every live process below the session's launcher but its keeper and
    snapshots counts too (a run's orphans are re-parented up that tree).
    """
    found = forked_survivors() if FORKSERVER is not None else []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


def descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` (zombies included), from the parent pids in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = process_stat(int(name))
            if stat is not None:
                children.setdefault(stat[2], []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_stat(pid: int) -> tuple[bytes, bytes, int] | None:
    """``(comm, state letter, parent pid)`` of ``pid`` from /proc/PID/stat, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            head, _, tail = f.read().rpartition(b")")
        fields = tail.split()
        return head.partition(b"(")[2], fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    stat = process_stat(pid)
    return stat is not None and stat[1] != b"Z"


def forked_survivors() -> list[int]:
    """Live processes below the session's launcher that are neither its keeper nor a snapshot."""
    assert FORKSERVER is not None
    found = []
    for pid in descendants(FORKSERVER.launcher_pid):
        stat = process_stat(pid)
        if pid != FORKSERVER.pid and stat is not None and stat[0] not in (b"cellbox-snap", b"cellbox-keeper"):
            if stat[1] != b"Z":
                found.append(pid)
    return found


def rss_bytes() -> int:
    """This process's current resident set size, bytes (from /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
