"""What a sandboxed start costs: cellbox against a bare ``subprocess.run``.

Times a trivial child (``python -c pass``) three ways, interleaved round by
round so that a busy moment on the machine hits all three alike:

* ``subprocess.run`` of the interpreter, nothing else (the floor);
* ``cellbox.sandbox.run`` of the same command under the default limits
  (launcher, rlimits, scrubbed environment, task directory, tree kill);
* the ``cellbox run -- python -c pass`` command line, end to end (adds the
  start of a Python process that imports cellbox).

Prints the median and the ratio to the floor for each.  Run it with::

    .venv/bin/python benchmarks/spawn.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable

from benchkit import cpu_model, interleaved, timed

from cellbox.sandbox import run
from cellbox.sandbox.outcome import Status

TRIVIAL = [sys.executable, "-c", "pass"]


def cellbox_command() -> list[str]:
    """The installed ``cellbox`` script next to this interpreter, else ``python -m cellbox.cli``."""
    script = os.path.join(os.path.dirname(sys.executable), "cellbox")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "cellbox.cli"]


def bare() -> None:
    subprocess.run(TRIVIAL, check=True)


def sandboxed() -> None:
    outcome = run(TRIVIAL)
    if outcome.status is not Status.OK:
        raise SystemExit(f"the sandboxed run ended {outcome.status}: {outcome.stderr.strip()}")


def command_line() -> None:
    subprocess.run([*cellbox_command(), "run", "--", *TRIVIAL], check=True, capture_output=True)


def measure(ways: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Run each way once per round, in turn; return seconds per call for each way."""
    return interleaved({name: timed(call) for name, call in ways.items()}, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="calls of each way (default 40)")
    rounds = parser.parse_args().rounds
    ways = {"subprocess.run": bare, "cellbox.sandbox.run": sandboxed, "cellbox run (CLI)": command_line}
    for call in ways.values():  # warm the page cache and imports once
        call()
    times = measure(ways, rounds)
    floor = statistics.median(times["subprocess.run"])
    python = platform.python_version()
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {python}, root={os.geteuid() == 0}")
    print(f"child: {' '.join(TRIVIAL)}; {rounds} rounds, interleaved")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<22} median {median * 1000:7.1f} ms   {median / floor:5.2f}x subprocess.run")


if __name__ == "__main__":
    main()
