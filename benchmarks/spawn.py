"""What a sandboxed start costs: cellbox against a bare ``subprocess.run``.

Times a trivial child (``python -c pass``) three ways, interleaved round by
round so that a busy moment on the machine hits all three alike:

* ``subprocess.run`` of the interpreter, nothing else (the floor);
* ``cellbox.sandbox.run`` of the same command under the default limits
  (launcher, rlimits, scrubbed environment, task directory, tree kill);
* the ``cellbox run -- python -c pass`` command line, end to end (adds the
  start of a Python process that imports cellbox, and its default isolation
  ``auto``: probing the machine's layers, bubblewrap, Landlock), and the same
  with ``--isolation none``.

Prints the median and the ratio to the floor for each.  Then, with
``--protections``, the added cost of each protection of a run against
``isolation="none"``, as the median of paired differences (same round):

* ``auto``: bubblewrap's namespaces, Landlock, the signal scope;
* ``auto, no bubblewrap``: Landlock, the syscall filter (libseccomp) and,
  as root, the switch to ``nobody``;
* ``auto, keep root, no bubblewrap``: as root, uid 0 with its capabilities dropped;
* ``auto + disk``: a 256M tmpfs over the task directory;
* ``none + resident``: a memory cgroup of 1G (root only).

Run it with::

    .venv/bin/python benchmarks/spawn.py [--rounds 40] [--protections]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator

from benchkit import cpu_model, interleaved, timed

from cellbox.sandbox import isolation as isolation_module
from cellbox.sandbox import run
from cellbox.sandbox.cgroups import memory_cgroup_root
from cellbox.sandbox.isolation import Isolation
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status

TRIVIAL = [sys.executable, "-c", "pass"]
# Debian's Python where there is one: as root without bubblewrap, `nobody` must reach the interpreter by itself.
PROTECTED = ["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable, "-c", "pass"]


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
    # cellbox run's default isolation is auto: the command line pays for the layers too.
    subprocess.run([*cellbox_command(), "run", "--", *TRIVIAL], check=True, capture_output=True)


@contextlib.contextmanager
def no_bubblewrap() -> Iterator[None]:
    """Runs inside find no bwrap (as on a machine without the bubblewrap package)."""
    path, fallback = os.environ.get("PATH", ""), isolation_module.BWRAP_FALLBACK
    os.environ["PATH"] = "/nonexistent"
    isolation_module.BWRAP_FALLBACK = "/nonexistent/bwrap"
    try:
        yield
    finally:
        os.environ["PATH"], isolation_module.BWRAP_FALLBACK = path, fallback


def protected(isolation: Isolation, limits: Limits | None = None, bubblewrap: bool = True) -> Callable[[], None]:
    """One sandboxed run of the trivial child with ``isolation`` and ``limits``; raises unless it is ok."""

    def call() -> None:
        with contextlib.nullcontext() if bubblewrap else no_bubblewrap():
            outcome = run(PROTECTED, limits=limits or Limits(), isolation=isolation, cwd="/")
        if outcome.status is not Status.OK:
            raise SystemExit(f"the run ended {outcome.status}: {outcome.stderr.strip()} {outcome.notes}")

    return call


def protections() -> dict[str, Callable[[], None]]:
    """The ways of ``--protections``: ``none`` first, the floor the others are compared with."""
    auto = Isolation(mode="auto")
    ways = {
        "none": protected(Isolation(mode="none")),
        "auto": protected(auto),
        "auto, no bubblewrap": protected(auto, bubblewrap=False),
        "auto + disk 256M": protected(auto, Limits(disk=256 * 1024**2)),
    }
    if os.geteuid() == 0:
        ways["auto, keep root, no bwrap"] = protected(Isolation.auto(keep_root=True), bubblewrap=False)
    if memory_cgroup_root() is not None:
        ways["none + resident 1G"] = protected(Isolation(mode="none"), Limits(resident=1024**3))
    return ways


def print_protections(times: dict[str, list[float]]) -> None:
    base = times["none"]
    for name, samples in times.items():
        added = statistics.median(b - a for a, b in zip(base, samples, strict=True))
        median = statistics.median(samples)
        print(f"{name:<28} median {median * 1000:7.1f} ms   added {added * 1000:+6.1f} ms per run")


def command_line_none() -> None:
    subprocess.run([*cellbox_command(), "run", "--isolation", "none", "--", *TRIVIAL], check=True, capture_output=True)


def measure(ways: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Run each way once per round, in turn; return seconds per call for each way."""
    return interleaved({name: timed(call) for name, call in ways.items()}, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="calls of each way (default 40)")
    parser.add_argument("--protections", action="store_true", help="also time each protection against isolation none")
    options = parser.parse_args()
    rounds = options.rounds
    ways = {
        "subprocess.run": bare,
        "cellbox.sandbox.run": sandboxed,
        "cellbox run (CLI)": command_line,
        "cellbox run, none": command_line_none,
    }
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
    if options.protections:
        more = protections()
        for call in more.values():
            call()
        print(f"protections: sandbox.run of {' '.join(PROTECTED)} with cwd /; {rounds} rounds, interleaved")
        print_protections(measure(more, rounds))


if __name__ == "__main__":
    main()
