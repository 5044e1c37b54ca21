"""Completion's reply time with 1 GiB of state: the cellbox kernel against ipykernel's python3, in one run.

Both kernels are started through jupyter_client in a throwaway folder, each
given a cell that holds a 1 GiB numpy array and a few names, then sent the
same ``complete_request`` in turn (interleaved rounds, so a busy moment hits
both alike).  cellbox answers each request in a run forked from the latest
snapshot (see docs/kernel.md); ipykernel answers in its own process.  Each
request alternates between a name (``big_a``) and an attribute
(``big_array.res``), and every reply is checked to hold the expected match.

Prints the median (and the 90th percentile) in milliseconds and the ratio
against ipykernel.  Run it with::

    .venv/bin/python benchmarks/completion.py [--rounds 40] [--setting --CellboxKernel.nice=0 ...]

Cells, and so these runs, have nice 19 by default (``CellboxKernel.nice``):
on a busy machine they wait for everything else, where ipykernel has nice 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from benchkit import cpu_model, interleaved
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNELS = {"cellbox": ("cellbox", ["--CellboxKernel.memory=4G"]), "ipykernel": ("python3", [])}
STATE = "import numpy as np\nbig_array = np.ones(2**30 // 8)\nbig_answer = 42"
REQUESTS = (("big_a", "big_answer"), ("big_array.res", "reshape"))


def started(which: str, cwd: str, settings: list[str]) -> tuple[KernelManager, BlockingKernelClient]:
    name, extra = KERNELS[which]
    km = KernelManager(kernel_name=name)
    km.start_kernel(cwd=cwd, extra_arguments=[*extra, *(settings if name == "cellbox" else [])])
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    reply = kc.execute_interactive(STATE, timeout=300, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"{which}: the state cell failed: {reply['content'].get('ename')}")
    return km, kc


def completion(kc: BlockingKernelClient, which: str) -> Callable[[], float]:
    """A measure: seconds from one complete_request to its reply, which must hold the expected match."""
    turn = [0]

    def measure() -> float:
        code, expected = REQUESTS[turn[0] % len(REQUESTS)]
        turn[0] += 1
        begin = time.perf_counter()
        msg_id = kc.complete(code, len(code))
        while True:
            reply = kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        elapsed = time.perf_counter() - begin
        if not any(expected in match for match in reply["content"]["matches"]):
            raise SystemExit(f"{which}: no {expected!r} in the completions of {code!r}: {reply['content']}")
        return elapsed

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=40, help="requests per kernel (default 40)")
    parser.add_argument("--setting", action="append", default=[], help="a --CellboxKernel.NAME=VALUE for cellbox")
    args = parser.parse_args()
    print(f"{platform.node()}: {cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"Python {platform.python_version()}, {sys.executable}, cellbox settings {args.setting or 'default'}")
    with tempfile.TemporaryDirectory(prefix="cellbox-bench-completion-") as cwd:
        kernels = {which: started(which, cwd, args.setting) for which in KERNELS}
        try:
            measures = {which: completion(kc, which) for which, (_km, kc) in kernels.items()}
            for measure in measures.values():
                measure()  # the first request of each: ipykernel's jedi warms up there
            times = interleaved(measures, args.rounds)
        finally:
            for km, kc in kernels.values():
                kc.stop_channels()
                km.shutdown_kernel(now=False)
    base = statistics.median(times["ipykernel"])
    for which, values in times.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(
            f"completion, 1 GiB of state: {which:<10} median {median * 1000:6.1f} ms, 90th percentile "
            f"{p90 * 1000:6.1f} ms ({median / base:4.2f}x ipykernel; {len(values)} requests)"
        )


if __name__ == "__main__":
    main()
