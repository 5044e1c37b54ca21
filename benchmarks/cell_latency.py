"""The cellbox kernel (its session of snapshots) against ipykernel's python3, side by side.

Three kernels are started in one run through jupyter_client: cellbox as
installed (the fork server, isolation ``auto``), cellbox with isolation
``none``, and ipykernel's ``python3``.  They are measured interleaved, so a
busy moment hits all three alike:

* **start to result**: from starting the kernel to the reply of its first
  cell (``1 + 1``), a new kernel each round;
* **numpy first cell**: the round trip of ``import numpy`` as the first cell
  of a new kernel (after it said it is ready);
* **trivial cell**: the ``execute_request`` to ``execute_reply`` round trip of
  ``pass`` on a kernel with an empty namespace, median over many cells;
* **trivial, 1 GiB**: the same on kernels that hold a 1 GiB numpy array;
* **run all**: ``--block`` ``pass`` cells sent back to back to one kernel
  (empty namespace), as a notebook's Run All sends them, per cell; the
  kernels take turns by block.  ipykernel's cells are faster back to back
  than one at a time between other kernels' (its process stays warm), each
  of cellbox's is a fresh process either way: this is the ratio a Run All of
  short cells sees;
* **define 1 GiB**: a cell that makes a new 1 GiB array (``np.ones``);
* **memory**: the cellbox kernel process's resident memory after 1, 100 and
  ``--memory-cells`` cells, and the PSS of all of a session's processes
  (kernel, keeper, snapshots) holding 1 GiB of state, against ipykernel's.

Prints medians in milliseconds and ratios against ipykernel.  Run it with::

    .venv/bin/python benchmarks/cell_latency.py [--cells 40] [--big 5] [--starts 5] [--memory-cells 1000]

``--against NAME`` adds a column: the kernel spec ``NAME``, started with cellbox's
arguments, interleaved with the rest.  Point it at another checkout's cellbox
(a kernel spec whose ``argv[0]`` is that checkout's virtualenv Python, see
docs/speed.md) to compare two commits in one run: their difference is then not
the machine's drift between two runs, which on a shared 2-core machine is as
large as most changes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import psutil
from benchkit import cpu_model, execute, interleaved
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNELS = {
    "cellbox": ("cellbox", []),
    "isolation none": ("cellbox", ["--CellboxKernel.isolation=none"]),
    "ipykernel": ("python3", []),
}
GIB_ARRAY = "import numpy as np\nbig = np.ones(2**30 // 8)"
# A 1 GiB array and the cell's own needs fit under this address-space limit.  The array is defined again and
# again, and each state kept for %undo holds its own: the session's memory bound (4G by default, a memory cgroup)
# is lifted, as ipykernel has none.
ROOMY = ["--CellboxKernel.memory=4G", "--CellboxKernel.session_memory=none"]


def started(which: str, cwd: str) -> tuple[KernelManager, BlockingKernelClient]:
    name, extra = KERNELS[which]
    km = KernelManager(kernel_name=name)
    km.start_kernel(cwd=cwd, extra_arguments=[*extra, *(ROOMY if which != "ipykernel" else [])])
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def stop(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def run_all(kc: BlockingKernelClient, count: int) -> float:
    """Seconds per cell of ``count`` ``pass`` cells sent back to back, each as soon as the last one's reply came."""
    begin = time.perf_counter()
    for _ in range(count):
        execute(kc, "pass")
    return (time.perf_counter() - begin) / count


def fresh(which: str, cwd: str, numpy: dict[str, list[float]]) -> float:
    """Seconds from starting ``which`` to its first result; a second new kernel's ``import numpy`` goes in ``numpy``."""
    begin = time.perf_counter()
    km, kc = started(which, cwd)
    try:
        execute(kc, "1 + 1")
        first = time.perf_counter() - begin
    finally:
        stop(km, kc)
    km, kc = started(which, cwd)
    try:
        numpy.setdefault(which, []).append(execute(kc, "import numpy"))
    finally:
        stop(km, kc)
    return first


def report(title: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["ipykernel"])
    parts = []
    for name, values in times.items():
        median = statistics.median(values)
        parts.append(f"{name} {median * 1000:7.1f} ms ({median / base:4.2f}x)")
    print(f"{title:<18} " + "   ".join(parts) + f"   (median of {len(times['ipykernel'])})")


def kernel_process(km: KernelManager) -> psutil.Process:
    return psutil.Process(int(km.provisioner.process.pid))  # type: ignore[union-attr]


def session_pss(km: KernelManager) -> int:
    """Bytes of PSS of the kernel process and every process below it (proportional: shared pages split)."""
    kernel = kernel_process(km)
    total = 0
    for process in [kernel, *kernel.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def memory(cwd: str, cells: int) -> None:
    for which in ("cellbox", "ipykernel"):
        km, kc = started(which, cwd)
        try:
            before = session_pss(km)
            execute(kc, GIB_ARRAY)
            for _ in range(5):
                execute(kc, "pass")
            held = session_pss(km)
            print(
                f"{which:<10} session pss: empty {before / 2**20:7.1f} MiB, with 1 GiB of state {held / 2**20:7.1f} MiB"
            )
        finally:
            stop(km, kc)
    if not cells:
        return
    km, kc = started("cellbox", cwd)
    try:
        kernel = kernel_process(km)
        for n in range(1, cells + 1):
            execute(kc, f"x = {n}")
            if n in (1, 100, cells):
                print(f"cellbox kernel after {n:>5} cells: rss {kernel.memory_info().rss / 2**20:.1f} MiB")
    finally:
        stop(km, kc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40, help="trivial cells per kernel and state (default 40)")
    parser.add_argument("--big", type=int, default=5, help="cells defining 1 GiB per kernel (default 5)")
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per kernel (default 5)")
    parser.add_argument("--memory-cells", type=int, default=1000, help="cells for the kernel memory check (0: skip)")
    parser.add_argument("--block", type=int, default=20, help="back-to-back cells per block for run all (default 20)")
    parser.add_argument(
        "--against", metavar="NAME", help="another cellbox kernel spec (another checkout's) to measure beside"
    )
    args = parser.parse_args()
    if args.against:
        KERNELS[args.against] = (args.against, [])
    print(
        f"python {platform.python_version()} on {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, {sys.executable}"
    )
    with tempfile.TemporaryDirectory() as cwd:
        os.chmod(cwd, 0o755)
        fresh_numpy: dict[str, list[float]] = {}
        starts = interleaved({k: (lambda k=k: fresh(k, cwd, fresh_numpy)) for k in KERNELS}, args.starts)
        report("start to result", starts)
        report("numpy first cell", fresh_numpy)
        kernels = {k: started(k, cwd) for k in KERNELS}
        try:
            for _km, kc in kernels.values():
                execute(kc, "pass")
            cells = {k: (lambda kc=kc: execute(kc, "pass")) for k, (_, kc) in kernels.items()}
            report("trivial cell", interleaved(cells, args.cells))
            blocks = {k: (lambda kc=kc: run_all(kc, args.block)) for k, (_, kc) in kernels.items()}
            report("run all", interleaved(blocks, max(1, args.cells // args.block)))
            defining = {k: (lambda kc=kc: execute(kc, GIB_ARRAY)) for k, (_, kc) in kernels.items()}
            report("define 1 GiB", interleaved(defining, args.big))
            report("trivial, 1 GiB", interleaved(cells, args.cells))
        finally:
            for km, kc in kernels.values():
                stop(km, kc)
        memory(cwd, args.memory_cells)


if __name__ == "__main__":
    main()
