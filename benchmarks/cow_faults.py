"""What a fork costs after it returns: the copy-on-write faults of a cell's process, against ipykernel's none.

Every cellbox cell runs in a fresh fork of the last cell's process (its spare,
:func:`cellbox.sandbox.snapshots.become_own_snapshot`), whose pages it shares
with the stopped snapshot it came from.  The first write to each shared page
is a page fault that copies it (fork(2), "copy-on-write"); CPython writes a
page whenever it touches an object there (its reference count), so a cell's
process copies every page its interpreter touches, once, in every cell.  A
long-lived process such as ipykernel's copies nothing.  This prints:

* **a copy-on-write fault**: microseconds to write one byte of each page of a
  16 MiB private mapping in a fresh fork, against the same writes again (no
  fault) and against ``madvise(MADV_POPULATE_WRITE)`` of the whole mapping
  (Linux 5.14: the same copies without a fault each);
* **IPython's run_cell("pass")** in a fresh fork of a warmed shell: its minor
  faults and time, against the same cell run again in that process;
* **a cell's process**: minor faults from its fork to its code's first line,
  on a cellbox kernel with isolation ``none`` (``/proc/self/stat``'s
  ``minflt``, proc(5)), against ipykernel's faults between two cells.

Medians.  Run it with::

    .venv/bin/python benchmarks/cow_faults.py [--rounds 40] [--cells 40]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import platform
import statistics
import sys
import tempfile
import time

from benchkit import cpu_model

PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14
# A cell that prints its process's minor faults so far (proc(5): field 10 of /proc/self/stat).
FAULTS = "print(int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[7]))"


def minor_faults() -> int:
    """This process's minor page faults so far (proc(5))."""
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[7])


def in_fork(measure: object) -> list[float]:
    """Run ``measure()`` (a list of floats) in a fresh fork of this process; its result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, repr(measure()).encode())  # type: ignore[operator]
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    return eval(said)  # noqa: S307 - a list of floats from our own child


def fault_cost(rounds: int, pages: int = 4096) -> dict[str, float]:
    """Median microseconds per page: a copy-on-write fault, a write without one, MADV_POPULATE_WRITE."""
    area = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for page in range(pages):
        area[page * PAGE] = 1  # every page present, and shared with each fork below
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    madvise = ctypes.CDLL(None, use_errno=True).madvise

    def writes() -> list[float]:
        times = []
        for _ in range(2):
            started = time.perf_counter()
            for page in range(pages):
                area[page * PAGE] = 2
            times.append((time.perf_counter() - started) / pages * 1e6)
        started = time.perf_counter()
        done = madvise(ctypes.c_void_p(address), ctypes.c_size_t(pages * PAGE), MADV_POPULATE_WRITE)
        populated = (time.perf_counter() - started) / pages * 1e6
        return [*times, populated if done == 0 else float("nan")]

    def populate() -> list[float]:
        started = time.perf_counter()
        done = madvise(ctypes.c_void_p(address), ctypes.c_size_t(pages * PAGE), MADV_POPULATE_WRITE)
        return [(time.perf_counter() - started) / pages * 1e6 if done == 0 else float("nan")]

    faulted, again, populated = [], [], []
    for _ in range(rounds):
        first, second, _after = in_fork(writes)
        faulted.append(first)
        again.append(second)
        populated.append(in_fork(populate)[0])
    return {
        "fault": statistics.median(faulted),
        "write": statistics.median(again),
        "populate": statistics.median(populated),
    }


def run_cell_in_fork(rounds: int) -> dict[str, float]:
    """Median faults and milliseconds of run_cell("pass") in a fresh fork of a warmed IPython shell, and again."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    for _ in range(3):
        shell.run_cell("pass", store_history=True)

    def cell() -> list[float]:
        before, started = minor_faults(), time.perf_counter()
        shell.run_cell("pass", store_history=True)
        faults, took = minor_faults() - before, time.perf_counter() - started
        started = time.perf_counter()
        shell.run_cell("pass", store_history=True)
        return [faults, took * 1000, (time.perf_counter() - started) * 1000]

    runs = [in_fork(cell) for _ in range(rounds)]
    return {
        "faults": statistics.median(run[0] for run in runs),
        "fresh": statistics.median(run[1] for run in runs),
        "again": statistics.median(run[2] for run in runs),
    }


def printed(kc: object, code: str) -> str:
    """What ``code`` printed on client ``kc``; fails loudly when the cell fails."""
    out: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=120, output_hook=hook)  # type: ignore[attr-defined]
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"benchmark cell {code!r} failed: {reply['content'].get('ename')}")
    return "".join(out)


def kernel_faults(cells: int) -> dict[str, float]:
    """Median minor faults per cell: from a cellbox cell's fork to its code, and between two ipykernel cells."""
    from jupyter_client.manager import start_new_kernel

    found = {}
    folder = tempfile.mkdtemp(prefix="cow-faults-")
    for label, name, extra in (
        ("cellbox, isolation none", "cellbox", ["--CellboxKernel.isolation=none"]),
        ("ipykernel", "python3", []),
    ):
        km, kc = start_new_kernel(kernel_name=name, extra_arguments=extra, cwd=folder)
        try:
            for _ in range(5):
                printed(kc, "pass")
            counts = [int(printed(kc, FAULTS)) for _ in range(cells + 1)]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        if name == "python3":
            counts = [later - earlier for earlier, later in zip(counts, counts[1:], strict=False)]
        found[label] = statistics.median(counts)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="forks measured per figure (default 40)")
    parser.add_argument("--cells", type=int, default=40, help="cells per kernel (default 40; 0: skip the kernels)")
    args = parser.parse_args()
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.release()}")
    cost = fault_cost(args.rounds)
    print(
        f"a copy-on-write fault: {cost['fault']:.2f} us per page; the same write again {cost['write']:.2f} us; "
        f"MADV_POPULATE_WRITE {cost['populate']:.2f} us per page (medians of {args.rounds} forks)"
    )
    cell = run_cell_in_fork(args.rounds)
    print(
        f"IPython run_cell('pass') in a fresh fork: {cell['faults']:.0f} faults, {cell['fresh']:.2f} ms; "
        f"again in that process: {cell['again']:.2f} ms (medians of {args.rounds})"
    )
    if args.cells:
        for label, faults in kernel_faults(args.cells).items():
            where = "from its fork to its code" if label.startswith("cellbox") else "between two cells"
            print(f"{label:24}: {faults:6.0f} minor faults per cell, {where} (median of {args.cells})")


if __name__ == "__main__":
    sys.exit(main())
