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


def execute(kc: object, code: str) -> float:
    """Seconds from sending ``code`` on client ``kc`` to its execute_reply; fails loudly when the cell fails."""
    begin = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - begin
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"benchmark cell {code!r} failed: {reply['content'].get('ename')}")
    return elapsed


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
