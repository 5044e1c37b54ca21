"""What the isolation layers cost: a sandboxed run with the layers against one without.

Times ``cellbox.sandbox.run`` of a trivial child two or three ways, interleaved
round by round so a busy moment on the machine hits all of them alike:

* ``isolation="none"``: rlimits, the allowlisted environment, the tree kill;
* ``isolation="auto"``: the same inside bubblewrap, with every layer this
  machine supports (net, pid, fs, user);
* optionally (``--numpy``) both again for a child that imports numpy, the
  typical first line of a notebook cell, which reads many files through the view.

Prints the medians and the median added time per run (the median of the
per-round differences).  Run it with::

    .venv/bin/python benchmarks/isolation.py [--rounds 40] [--numpy]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections.abc import Callable

from benchkit import cpu_model, interleaved, timed

from cellbox.sandbox import run
from cellbox.sandbox.isolation import LAYERS, probe
from cellbox.sandbox.outcome import Status

TRIVIAL = [sys.executable, "-c", "pass"]
NUMPY = [sys.executable, "-c", "import numpy"]


def sandboxed(argv: list[str], isolation: str) -> Callable[[], None]:
    """A call that runs ``argv`` in the sandbox with ``isolation`` and checks that it ended ``ok``."""

    def call() -> None:
        outcome = run(argv, isolation=isolation)
        if outcome.status is not Status.OK:
            raise SystemExit(f"the {isolation} run ended {outcome.status}: {outcome.stderr.strip()}")

    return call


def measure(ways: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Run each way once per round, in turn; return seconds per call for each way."""
    return interleaved({name: timed(call) for name, call in ways.items()}, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="calls of each way (default 40)")
    parser.add_argument("--numpy", action="store_true", help="also time a child that imports numpy")
    args = parser.parse_args()
    support = probe()
    active = [layer for layer in LAYERS if support.available(layer)]
    if not active:
        raise SystemExit(f"no isolation layer works here: {support.missing}; see `cellbox doctor`")
    children = {"pass": TRIVIAL, **({"import numpy": NUMPY} if args.numpy else {})}
    ways = {f"{label}, {mode}": sandboxed(argv, mode) for label, argv in children.items() for mode in ("none", "auto")}
    for call in ways.values():  # warm the page cache, imports and the probe once
        call()
    times = measure(ways, args.rounds)
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}, ", end="")
    print(f"root={os.geteuid() == 0}, bwrap {support.bwrap}, layers {','.join(active)}")
    print(f"{args.rounds} rounds, interleaved")
    for label in children:
        none, auto = times[f"{label}, none"], times[f"{label}, auto"]
        bare, isolated = statistics.median(none), statistics.median(auto)
        # The two runs of one round are next to each other in time: the median of
        # their differences is steadier on a busy machine than a difference of medians.
        added = statistics.median(b - a for a, b in zip(none, auto, strict=True))
        print(
            f"python -c '{label}': none {bare * 1000:6.1f} ms   auto {isolated * 1000:6.1f} ms   "
            f"added {added * 1000:+6.1f} ms per run (median of paired differences; ratio {isolated / bare:4.2f}x)"
        )


if __name__ == "__main__":
    main()
