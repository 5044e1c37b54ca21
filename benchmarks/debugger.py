"""The first debugged cell of a session: the cellbox kernel against ipykernel's python3, in one run.

Each round starts a fresh kernel of each kind (interleaved, so a busy moment hits both alike) and does what
JupyterLab does when a user turns the debugger on and runs a cell with a breakpoint: ``initialize``, ``attach``,
``configurationDone``, ``dumpCell``, ``setBreakpoints`` (line 2), then ``execute_request``; the cell stops at its
breakpoint, is continued, and ends.  Measured: seconds from ``initialize`` to the ``stopped`` event (what the user
waits for; under ipykernel ``initialize`` starts debugpy's adapter, under cellbox the first debugged cell imports
pydevd), and from the ``execute_request`` to the ``stopped`` event.  Every round checks the stop's line.

Prints the medians and cellbox's extra seconds over ipykernel (the target: at most 2 s).  Run it with::

    .venv/bin/python benchmarks/debugger.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from queue import Empty
from typing import Any

from benchkit import cpu_model
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNELS = {"cellbox": "cellbox", "ipykernel": "python3"}
CELL = "a = 1\nb = a + 1\nprint(b)\n"
LINE = 2
TIMEOUT = 120.0


def dap(kc: BlockingKernelClient, command: str, seq: int, **arguments: Any) -> dict[str, Any]:
    msg = kc.session.msg("debug_request", {"seq": seq, "type": "request", "command": command, "arguments": arguments})
    kc.control_channel.send(msg)
    while True:
        reply = kc.control_channel.get_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return dict(reply["content"])


def stopped_event(kc: BlockingKernelClient) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Empty:
            continue
        if msg["msg_type"] == "debug_event" and msg["content"]["event"] == "stopped":
            return dict(msg["content"])
    raise SystemExit("no stopped event")


def one_round(name: str, cwd: str) -> tuple[float, float]:
    """(initialize to stopped, execute to stopped) in seconds, for one fresh kernel ``name``."""
    km = KernelManager(kernel_name=name)
    km.start_kernel(cwd=cwd)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        kc.execute_interactive("x = 0", timeout=TIMEOUT, output_hook=lambda msg: None)  # the session is ready
        begin = time.perf_counter()
        dap(kc, "initialize", 1, clientID="jupyterlab", adapterID="python", pathFormat="path", linesStartAt1=True)
        dap(kc, "attach", 2)
        dap(kc, "configurationDone", 3)
        path = dap(kc, "dumpCell", 4, code=CELL)["body"]["sourcePath"]
        dap(kc, "setBreakpoints", 5, source={"path": path}, breakpoints=[{"line": LINE}])
        asked = time.perf_counter()
        kc.execute(CELL)
        event = stopped_event(kc)
        stopped = time.perf_counter()
        frames = dap(kc, "stackTrace", 6, threadId=event["body"]["threadId"])["body"]["stackFrames"]
        if frames[0]["line"] != LINE:
            raise SystemExit(f"{name}: stopped at line {frames[0]['line']}, not {LINE}")
        dap(kc, "continue", 7, threadId=event["body"]["threadId"])
        kc.get_shell_msg(timeout=TIMEOUT)
        return stopped - begin, stopped - asked
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh kernels of each kind (default 5)")
    args = parser.parse_args(argv)
    times: dict[str, list[tuple[float, float]]] = {which: [] for which in KERNELS}
    with tempfile.TemporaryDirectory(prefix="cellbox-bench-debugger-") as folder:
        os.environ["IPYTHONDIR"] = os.path.join(folder, "ipython")
        for _ in range(args.rounds):
            for which, name in KERNELS.items():
                times[which].append(one_round(name, folder))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cpus, Python {platform.python_version()}, {sys.platform}")
    medians = {}
    for which, rounds in times.items():
        whole = statistics.median(r[0] for r in rounds)
        cell = statistics.median(r[1] for r in rounds)
        medians[which] = whole
        line = f"{which:10s} initialize to stopped {whole:6.2f} s   execute to stopped {cell:6.2f} s"
        print(f"{line}   ({len(rounds)} rounds)")
    print(f"cellbox's first debugged cell: {medians['cellbox'] - medians['ipykernel']:+.2f} s against ipykernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
