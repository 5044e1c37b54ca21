"""The floor under a cellbox cell: one fork of the session's interpreter, against ipykernel's whole cell.

Every cell cellbox runs ends with one fork of its process (the next cell's
spare, :func:`cellbox.sandbox.snapshots.become_own_snapshot`) before its
reply, since no code of a cell may run after the reply.  This measures that
fork alone, with nothing else of cellbox around it, in a process that has
imported what a session's base snapshot imports (``CELL_PRELOAD``), then
with 1 GiB of numpy state on top, and in a bare interpreter for comparison;
each time in a fork of that interpreter, as a cell's process is a fork of its
snapshot:

* **fork**: from ``os.fork()`` to its return in the parent (the child ends
  at once with ``os._exit``);
* **fork and reap**: the same, then ``os.waitpid`` until the child is gone;
* **sibling fork**: the fork cellbox makes there (clone(2) with
  ``CLONE_PARENT``, :func:`cellbox.sandbox.snapshots.sibling_fork`), to its
  return in the parent.

Beside them, the median ``execute_request`` to ``execute_reply`` round trip
of ``pass`` on ipykernel's ``python3`` in the same run, so the floor reads as
a share of the cell a ratio target is taken against.  Then the steps of a
cell's end as it runs them (checks, ``/proc/self/maps``, the fork, checks
again, each once in a fresh fork whose spares stay alive and stopped), and
``pass`` cells on cellbox kernels that keep different numbers of earlier
states (``undo_depth``; isolation ``none``) beside ipykernel, interleaved.
Prints medians in milliseconds.  Run it with::

    .venv/bin/python benchmarks/fork_floor.py [--rounds 200] [--cells 40] [--ends 100] [--depths 0,1,10]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys

from benchkit import cpu_model, execute

MEASURE = r"""
import importlib, json, os, select, statistics, sys, time
for name in sys.argv[3:]:
    importlib.import_module(name)
if sys.argv[2] == "big":
    import numpy
    state = numpy.ones(2**30 // 8)  # 1 GiB, every page touched
from cellbox.sandbox import snapshots
snapshots.TID_OFFSET = snapshots.find_tid_offset()  # as the keeper finds it at its start
read_end, write_end = os.pipe()
# The forks are made in a fork of this interpreter, as a cell's process is a fork of its snapshot; the siblings
# it makes are this process's children, reaped here.
measurer = os.fork()
if measurer == 0:
    forks, reaps, siblings = [], [], []
    for _ in range(int(sys.argv[1])):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked = time.perf_counter()
        os.waitpid(pid, 0)
        forks.append(forked - started)
        reaps.append(time.perf_counter() - started)
    for _ in range(int(sys.argv[1])):
        started = time.perf_counter()
        pid = snapshots.sibling_fork()
        if pid == 0:
            os._exit(0)
        siblings.append(time.perf_counter() - started)
        try:
            gone = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # exited and reaped already
        select.select([gone], [], [])  # readable once it has exited, so its exit never overlaps the next fork
        os.close(gone)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    medians = {"fork": forks, "reap": reaps, "sibling": siblings}
    os.write(write_end, json.dumps({**{k: statistics.median(v) for k, v in medians.items()}, "rss_kib": rss}).encode())
    os._exit(0)
os.close(write_end)
while True:
    try:
        if os.waitpid(-1, 0)[0] == measurer:
            break
    except ChildProcessError:
        break
print(os.read(read_end, 65536).decode())
"""


# The steps of a cell's end, each timed once in a fresh fork of the interpreter (a cell's process is a fork of
# its snapshot), with the spares it forks left alive and stopped, as a cell leaves its spare.
MEASURE_END = r"""
import importlib, json, os, signal, socket, statistics, sys, time
for name in sys.argv[2:]:
    importlib.import_module(name)
from cellbox.sandbox import atfork, snapshots
snapshots.TID_OFFSET = snapshots.find_tid_offset()
atfork.at_base = atfork.registered  # as the base snapshot sets it after its imports
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
session = {mine.fileno(), theirs.fileno()}
names = ["checks", "maps", "sibling fork", "checks after it", "second sibling fork", "os.fork after that"]
steps = {name: [] for name in names}
def stopped(pid):
    if pid == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    return pid
for _ in range(int(sys.argv[1])):
    read_end, write_end = os.pipe()
    cell = os.fork()
    if cell == 0:
        marks = [time.perf_counter()]
        problems = [snapshots.own_snapshot_problem(session)]
        marks.append(time.perf_counter())
        snapshots.shared_mappings()
        marks.append(time.perf_counter())
        spares = [stopped(snapshots.sibling_fork())]
        marks.append(time.perf_counter())
        problems.append(snapshots.own_snapshot_problem(session))
        marks.append(time.perf_counter())
        spares.append(stopped(snapshots.sibling_fork()))
        marks.append(time.perf_counter())
        spares.append(stopped(os.fork()))
        marks.append(time.perf_counter())
        for spare in spares:
            os.kill(spare, signal.SIGKILL)
        os.write(write_end, json.dumps([[b - a for a, b in zip(marks, marks[1:])], problems]).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    times, problems = json.loads(data)
    if problems != [None, None]:
        sys.exit(f"the measuring process may not be its own snapshot: {problems}")
    for name, took in zip(names, times):
        steps[name].append(took)
print(json.dumps({name: statistics.median(values) for name, values in steps.items()}))
"""


def measure_end(rounds: int, modules: list[str]) -> dict[str, float]:
    """Medians (seconds) of each step of a cell's end (:data:`MEASURE_END`), over ``rounds`` fresh forks."""
    import json

    done = subprocess.run([sys.executable, "-c", MEASURE_END, str(rounds), *modules], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the measuring interpreter failed:\n{done.stderr}")
    return json.loads(done.stdout)


def depth_cells(depths: list[int], cells: int) -> dict[str, float]:
    """Median round trips (seconds) of ``pass`` on cellbox kernels (isolation ``none``) keeping each of
    ``depths`` earlier states (``undo_depth``), and on ipykernel's ``python3``, measured interleaved."""
    from jupyter_client.manager import start_new_kernel

    kernels = {
        f"cellbox, undo_depth={depth}": (
            "cellbox",
            [f"--CellboxKernel.undo_depth={depth}", "--CellboxKernel.isolation=none"],
        )
        for depth in depths
    }
    kernels["ipykernel"] = ("python3", [])
    started = {}
    try:
        for label, (name, extra) in kernels.items():
            started[label] = start_new_kernel(kernel_name=name, extra_arguments=extra)
        for _km, kc in started.values():
            for _ in range(5):
                execute(kc, "pass")
        times: dict[str, list[float]] = {label: [] for label in started}
        for _ in range(cells):
            for label, (_km, kc) in started.items():
                times[label].append(execute(kc, "pass"))
        return {label: statistics.median(values) for label, values in times.items()}
    finally:
        for km, kc in started.values():
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def measure_forks(rounds: int, modules: list[str], big: bool) -> dict[str, float]:
    """Medians (seconds) of a fork, and of a fork and its reap, in a new interpreter that imported ``modules``
    (and, with ``big``, holds 1 GiB of numpy state); its resident KiB."""
    import json

    state = "big" if big else "small"
    done = subprocess.run([sys.executable, "-c", MEASURE, str(rounds), state, *modules], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the measuring interpreter failed:\n{done.stderr}")
    out = done.stdout
    return json.loads(out)


def ipykernel_cell(cells: int) -> float:
    """The median round trip (seconds) of ``pass`` on ipykernel's ``python3``, over ``cells`` cells."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        for _ in range(3):
            execute(kc, "pass")
        return statistics.median(execute(kc, "pass") for _ in range(cells))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="forks measured per interpreter (default 200)")
    parser.add_argument("--cells", type=int, default=40, help="cells measured per kernel (default 40)")
    parser.add_argument("--ends", type=int, default=100, help="cell ends timed step by step (default 100)")
    parser.add_argument(
        "--depths", default="0,1,10", help="undo_depth of each cellbox kernel compared (default 0,1,10; '' to skip)"
    )
    args = parser.parse_args()
    from cellbox.kernel.kernel import CELL_PRELOAD

    print(f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.release()}")
    cell = ipykernel_cell(args.cells)
    print(f"ipykernel python3, trivial cell: {cell * 1000:7.2f} ms (median of {args.cells})")
    for label, modules, big in (
        ("bare interpreter", [], False),
        ("session's imports", list(CELL_PRELOAD), False),
        ("and 1 GiB of state", list(CELL_PRELOAD), True),
    ):
        facts = measure_forks(args.rounds, modules, big)
        print(
            f"{label:18}: RSS {facts['rss_kib'] / 1024:6.1f} MiB, fork {facts['fork'] * 1000:6.2f} ms "
            f"({facts['fork'] / cell:.2f} of ipykernel's cell), fork and reap {facts['reap'] * 1000:6.2f} ms, "
            f"cellbox's sibling fork {facts['sibling'] * 1000:6.2f} ms ({facts['sibling'] / cell:.2f}; "
            f"medians of {args.rounds})"
        )
    print(f"a cell's end, step by step, each in a fresh fork with the session's imports (medians of {args.ends}):")
    for step, took in measure_end(args.ends, list(CELL_PRELOAD)).items():
        print(f"  {step:20} {took * 1000:6.2f} ms")
    depths = [int(depth) for depth in args.depths.split(",") if depth.strip()]
    if depths:
        print(f"pass cells, interleaved (medians of {args.cells}):")
        for label, took in depth_cells(depths, args.cells).items():
            print(f"  {label:22} {took * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
