"""What the benchmark scripts share: interleaved rounds and the machine's description.

Each way is measured once per round, in turn, so a change in the machine's
load touches every way alike; the scripts print medians of these rounds.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable


def interleaved(measures: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Call each measure once per round, in turn; return its results (seconds) per name."""
    times: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(rounds):
        for name, measure in measures.items():
            times[name].append(measure())
    return times


def timed(call: Callable[[], object]) -> Callable[[], float]:
    """A measure that runs ``call`` and returns the seconds it took (``time.perf_counter``)."""

    def measure() -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    return measure


def cpu_model() -> str:
    """The processor's model name, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
