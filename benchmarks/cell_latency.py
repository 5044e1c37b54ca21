"""What a fresh process per cell costs: the cellbox kernel against ipykernel's python3.

Three kernels are started in the same run, through jupyter_client: cellbox
(each cell a new interpreter), cellbox with ``start_method=forkserver`` (each
cell forked from a warm server of the session) and ipykernel's ``python3``.
They are measured three ways:

* **start**: from starting the kernel to the result of its first cell
  (``1 + 1``), repeated with a new kernel each round;
* **trivial cell**: the round trip of ``execute_request`` to ``execute_reply``
  for ``pass``, the median over many cells on one kernel, interleaved between
  the kernels so that a busy moment hits all of them alike;
* **import numpy**: the round trip of a cell that imports numpy.

Prints medians in milliseconds and the ratio to ipykernel.  Run it with::

    .venv/bin/python benchmarks/cell_latency.py [--cells 40] [--numpy 10] [--starts 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

from benchkit import interleaved
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

# Name shown -> (kernelspec, extra kernel arguments).
KERNELS = {
    "cellbox": ("cellbox", []),
    "cellbox-forkserver": ("cellbox", ["--CellboxKernel.start_method=forkserver"]),
    "ipykernel": ("python3", []),
}


def started(name: str, cwd: str) -> tuple[KernelManager, BlockingKernelClient]:
    spec, extra = KERNELS[name]
    km = KernelManager(kernel_name=spec)
    km.start_kernel(cwd=cwd, extra_arguments=extra)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def stop(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def round_trip(kc: BlockingKernelClient, code: str) -> float:
    """Seconds from sending ``code`` to its execute_reply; fails loudly when the cell fails."""
    begin = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
    elapsed = time.perf_counter() - begin
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"benchmark cell {code!r} failed: {reply['content'].get('ename')}")
    return elapsed


def first_result(name: str, cwd: str) -> float:
    """Seconds from starting kernel ``name`` to the reply of its first cell."""
    begin = time.perf_counter()
    km, kc = started(name, cwd)
    try:
        round_trip(kc, "1 + 1")
        return time.perf_counter() - begin
    finally:
        stop(km, kc)


def report(title: str, times: dict[str, list[float]]) -> None:
    """One line per kernel: the median in ms and its ratio to ipykernel's."""
    floor = statistics.median(times["ipykernel"])
    for name, values in times.items():
        median = statistics.median(values)
        ratio = median / floor
        print(f"{title:<16} {name:<19} {median * 1000:8.1f} ms   {ratio:6.1f}x ipykernel   (median of {len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40, help="trivial cells per kernel (default 40)")
    parser.add_argument("--numpy", type=int, default=10, help="import-numpy cells per kernel (default 10)")
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per kernel (default 5)")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, {sys.executable}")
    with tempfile.TemporaryDirectory() as cwd:
        starts = interleaved({name: (lambda n=name: first_result(n, cwd)) for name in KERNELS}, args.starts)
        report("start to result", starts)
        kernels = {name: started(name, cwd) for name in KERNELS}
        try:
            time.sleep(5)  # let the fork server finish its imports: cells that come earlier are spawned
            for _km, kc in kernels.values():
                round_trip(kc, "pass")  # warm up
            trivial = interleaved(
                {n: (lambda kc=kc: round_trip(kc, "pass")) for n, (_k, kc) in kernels.items()}, args.cells
            )
            report("trivial cell", trivial)
            # ipykernel loads numpy on the first of these cells only (later ones find
            # it in sys.modules), as a user sees it; every cellbox cell is a new
            # process that loads numpy again.
            numpy = interleaved(
                {n: (lambda kc=kc: round_trip(kc, "import numpy")) for n, (_k, kc) in kernels.items()}, args.numpy
            )
            report("import numpy", numpy)
        finally:
            for km, kc in kernels.values():
                stop(km, kc)


if __name__ == "__main__":
    main()
