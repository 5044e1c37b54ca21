"""Warm start: the cellbox kernel with its fork server and with spawn, against ipykernel's python3.

Three kernels are started in one run through jupyter_client (cellbox with
``--CellboxKernel.start_method=forkserver``, the default; cellbox with
``spawn``; ipykernel's ``python3``) and measured side by side, interleaved so
a busy moment hits all three alike:

* **start to result**: from starting the kernel to the reply of its first
  cell (``1 + 1``), a new kernel each round;
* **fresh import numpy**: the cell after that, ``import numpy``, in the same
  new kernel (ipykernel imports numpy for the first time here);
* **trivial cell**: the ``execute_request`` to ``execute_reply`` round trip
  of ``pass`` on a kernel that has run cells before, median over many cells;
* **import numpy**: the round trip of ``import numpy`` on such a kernel
  (ipykernel finds it in ``sys.modules``; every cellbox cell is a new process);
* **memory**: the fork server's resident memory, and the cellbox kernel
  process's after 1, 100 and ``--memory-cells`` cells.

Prints medians in milliseconds and ratios against ipykernel.  Run it with::

    .venv/bin/python benchmarks/cell_latency.py [--cells 40] [--numpy 10] [--starts 5] [--memory-cells 1000]
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
from benchkit import cpu_model, interleaved
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNELS = {
    "forkserver": ("cellbox", ["--CellboxKernel.start_method=forkserver"]),
    "spawn": ("cellbox", ["--CellboxKernel.start_method=spawn"]),
    "ipykernel": ("python3", []),
}
SERVER_NAME = "cellbox-forksrv"


def started(which: str, cwd: str) -> tuple[KernelManager, BlockingKernelClient]:
    name, extra = KERNELS[which]
    km = KernelManager(kernel_name=name)
    km.start_kernel(cwd=cwd, extra_arguments=extra)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def stop(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def execute(kc: BlockingKernelClient, code: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    """Seconds from sending ``code`` to its execute_reply, and the reply; fails loudly when the cell fails."""
    begin = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
    elapsed = time.perf_counter() - begin
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"benchmark cell {code!r} failed: {reply['content'].get('ename')}")
    return elapsed, reply


def forked(reply: dict) -> bool:  # type: ignore[type-arg]
    return "forkserver" in reply["metadata"].get("cellbox", {}).get("isolation", [])


def until_forked(kc: BlockingKernelClient, limit: float = 60.0) -> None:
    """Run empty cells until one is forked (the server imports in the background after the first cell)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if forked(execute(kc, "pass")[1]):
            return
        time.sleep(0.2)
    raise SystemExit("the fork server did not become ready within a minute")


def fresh(which: str, cwd: str, numpy: dict[str, list[float]]) -> float:
    """Seconds from starting ``which`` to its first result; the next cell's ``import numpy`` goes in ``numpy``."""
    begin = time.perf_counter()
    km, kc = started(which, cwd)
    try:
        execute(kc, "1 + 1")
        first = time.perf_counter() - begin
        numpy.setdefault(which, []).append(execute(kc, "import numpy")[0])
        return first
    finally:
        stop(km, kc)


def report(title: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["ipykernel"])
    parts = []
    for name, values in times.items():
        median = statistics.median(values)
        parts.append(f"{name} {median * 1000:7.1f} ms ({median / base:4.2f}x)")
    print(f"{title:<19} " + "   ".join(parts) + f"   (median of {len(times['ipykernel'])})")


def kernel_process(km: KernelManager) -> psutil.Process:
    pid = km.provisioner.pid if km.provisioner is not None else None  # type: ignore[attr-defined]
    return psutil.Process(pid)


def memory(cwd: str, cells: int) -> None:
    km, kc = started("forkserver", cwd)
    try:
        until_forked(kc)
        kernel = kernel_process(km)
        servers = [p for p in kernel.children(recursive=True) if p.name() == SERVER_NAME]
        if servers:
            info = servers[0].memory_full_info()
            print(
                f"fork server      rss {info.rss / 2**20:.1f} MiB, uss {info.uss / 2**20:.1f} MiB, pid {servers[0].pid}"
            )
        marks = {1, 100, cells}
        for n in range(1, cells + 1):
            execute(kc, f"x = {n}")
            if n in marks:
                print(f"kernel after {n:>5} cells: rss {kernel.memory_info().rss / 2**20:.1f} MiB")
    finally:
        stop(km, kc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40, help="trivial cells per kernel (default 40)")
    parser.add_argument("--numpy", type=int, default=10, help="import-numpy cells per kernel (default 10)")
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per kernel (default 5)")
    parser.add_argument("--memory-cells", type=int, default=1000, help="cells for the kernel memory check (0: skip)")
    args = parser.parse_args()
    print(
        f"python {platform.python_version()} on {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, {sys.executable}"
    )
    with tempfile.TemporaryDirectory() as cwd:
        fresh_numpy: dict[str, list[float]] = {}
        starts = interleaved({k: (lambda k=k: fresh(k, cwd, fresh_numpy)) for k in KERNELS}, args.starts)
        report("start to result", starts)
        report("fresh import numpy", fresh_numpy)
        kernels = {k: started(k, cwd) for k in KERNELS}
        try:
            until_forked(kernels["forkserver"][1])
            for _km, kc in kernels.values():
                execute(kc, "pass")
            trivial = interleaved(
                {k: (lambda kc=kc: execute(kc, "pass")[0]) for k, (_, kc) in kernels.items()}, args.cells
            )
            report("trivial cell", trivial)
            numpy = interleaved(
                {k: (lambda kc=kc: execute(kc, "import numpy")[0]) for k, (_, kc) in kernels.items()}, args.numpy
            )
            report("import numpy", numpy)
        finally:
            for km, kc in kernels.values():
                stop(km, kc)
        if args.memory_cells:
            memory(cwd, args.memory_cells)


if __name__ == "__main__":
    main()
