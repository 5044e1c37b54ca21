"""Whole teaching notebooks under cellbox and ipykernel: identical cells and the time each takes.

Runs every notebook in ``benchmarks/notebooks/`` (small notebooks in the style
of public teaching material: a Python tour, NumPy basics, plotting, errors and
magics, and two long lectures of 120 and 110 one-line cells, written after the
scientific-python-lectures' Lecture-1 and Lecture-2, where the per-cell cost
shows) through nbclient under the ``cellbox`` kernel and ipykernel's
``python3``, in turn, ``--rounds`` times each, in a fresh folder each run.
For each notebook it prints:

* **identical**: cells whose outputs are the same under both kernels, after
  normalising what differs by nature (object addresses, timings, PNG bytes,
  the folder's path, how a stream's text was cut into messages);
* **time**: the median of the whole notebook's run (kernel start included),
  and the ratio against ipykernel.

Run it with::

    .venv/bin/python benchmarks/notebooks.py [--rounds 3] [NOTEBOOK ...]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from benchkit import cpu_model
from nbclient import NotebookClient

HERE = Path(__file__).with_name("notebooks")
KERNELS = {"cellbox": "cellbox", "ipykernel": "python3"}
ADDRESS = re.compile(r"0x[0-9a-f]{6,}")
TIMING = re.compile(r"\d+(\.\d+)? ?(ns|µs|μs|us|ms|s)\b.*|Wall time:.*|CPU times:.*")


def run(path: Path, kernel: str) -> tuple[float, list[Any]]:
    """Seconds to run the notebook at ``path`` under ``kernel`` in a new folder, and its normalised outputs."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        client = NotebookClient(
            copy.deepcopy(nb),
            kernel_name=kernel,
            timeout=120,
            allow_errors=True,
            resources={"metadata": {"path": folder}},
        )
        begin = time.perf_counter()
        done = client.execute()
        elapsed = time.perf_counter() - begin
        outputs = [normalised(cell.get("outputs", []), folder) for cell in done.cells if cell.cell_type == "code"]
    return elapsed, outputs


def normalised(outputs: list[Any], folder: str) -> list[Any]:
    """What a reader sees of a cell's outputs, without what differs by nature between two runs."""
    seen = []
    for output in outputs:
        kind = output["output_type"]
        if kind == "stream" and seen and seen[-1][:2] == (kind, output["name"]):
            # A frontend shows consecutive writes to one stream as one text, however the kernel cut them.
            seen[-1] = (kind, output["name"], seen[-1][2] + clean(output["text"], folder))
        elif kind == "stream":
            seen.append((kind, output["name"], clean(output["text"], folder)))
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            seen.append((kind, sorted(data), clean(str(data.get("text/plain", "")), folder)))
        elif kind == "error":
            seen.append((kind, output["ename"], clean(output["evalue"], folder)))
    return seen


def clean(text: str, folder: str) -> str:
    return TIMING.sub("<time>", ADDRESS.sub("0x…", text.replace(folder, "<folder>")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each notebook under each kernel (default 3)")
    parser.add_argument("notebooks", nargs="*", help="notebook names in benchmarks/notebooks (default: all)")
    args = parser.parse_args()
    print(
        f"python {platform.python_version()} on {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, {sys.executable}"
    )
    paths = [HERE / f"{name.removesuffix('.ipynb')}.ipynb" for name in args.notebooks] or sorted(HERE.glob("*.ipynb"))
    total_same = total_cells = 0
    for path in paths:
        times: dict[str, list[float]] = {name: [] for name in KERNELS}
        outputs: dict[str, list[Any]] = {}
        for _ in range(args.rounds):
            for name, kernel in KERNELS.items():
                elapsed, outputs[name] = run(path, kernel)
                times[name].append(elapsed)
        same = sum(a == b for a, b in zip(outputs["cellbox"], outputs["ipykernel"], strict=True))
        cells = len(outputs["ipykernel"])
        total_same, total_cells = total_same + same, total_cells + cells
        ours, theirs = statistics.median(times["cellbox"]), statistics.median(times["ipykernel"])
        print(
            f"{path.stem:<20} identical {same:>3}/{cells:<3}  cellbox {ours:6.2f} s  ipykernel {theirs:6.2f} s  "
            f"({ours / theirs:4.2f}x, median of {args.rounds})"
        )
        for number, (a, b) in enumerate(zip(outputs["cellbox"], outputs["ipykernel"], strict=True)):
            if a != b:
                print(f"    cell {number}: cellbox {a!r:.160}\n            ipykernel {b!r:.160}")
    print(f"{'all':<20} identical {total_same:>3}/{total_cells:<3} ({100 * total_same / max(total_cells, 1):.1f}%)")


if __name__ == "__main__":
    main()
