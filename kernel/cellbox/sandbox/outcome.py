"""The result of one sandboxed run: :class:`Status` and :class:`Outcome`.

The status strings are the design's exact words; compare them by equality.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

__all__ = ["Status", "Outcome", "STATUS_EXIT_CODES"]


class Status(enum.StrEnum):
    """How a run ended.  Exactly one applies; precedence is in :func:`cellbox.sandbox.classify`.

    The value is the exact string used in JSON, the documentation and the lessons.
    """

    OK = "ok"
    ERROR = "error"
    CRASHED = "crashed"
    TIMED_OUT = "timed_out"
    CPU_LIMIT = "cpu_limit"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    INTERRUPTED = "interrupted"


# Exit status of `cellbox run` for each status (documented in docs/reference/statuses.md).
# 1 and 2 stay free for cellbox's own failures and usage errors (argparse).
STATUS_EXIT_CODES: dict[Status, int] = {
    Status.OK: 0,
    Status.ERROR: 10,
    Status.CRASHED: 11,
    Status.TIMED_OUT: 12,
    Status.CPU_LIMIT: 13,
    Status.MEMORY_LIMIT: 14,
    Status.OUTPUT_LIMIT: 15,
    Status.INTERRUPTED: 16,
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished run, with figures from the OS (``os.wait4`` rusage).

    Attributes:
        status: how the run ended (:class:`Status`).
        exit_code: the command's exit code, or ``None`` when a signal ended it.
        signal: the name of the signal that ended the command (``"SIGKILL"``), or ``None``.
        wall_time: seconds from start until the run was over.
        cpu_time: user plus system CPU seconds of every process of the run that was reaped.
        peak_memory: largest resident set size of any one process of the run, bytes.
        stdout: what the command wrote on stdout (kept part, decoded as UTF-8 with replacement).
        stderr: the same for stderr.
        truncated: ``True`` when output past the ``output`` limit was dropped.
        isolation: the containment layers that were active (for example ``"rlimits"``,
            ``"process-tree-kill"``, ``"pids-cgroup"``).
        notes: limits or layers that could not be applied on this machine, one sentence each.
        killed_processes: how many processes were still running at the end and were killed.
        as_root: ``True`` when the command ran as root, which a sandbox cannot contain.
        limits: the limits the run had, as a dict.
        supervisor_lost: ``True`` when the run's supervisor ended without its report (killed,
            perhaps by the program): ``killed_processes`` then counts what the parent found and
            killed, and processes may have escaped (the notes say so).
    """

    status: Status
    exit_code: int | None
    signal: str | None
    wall_time: float
    cpu_time: float
    peak_memory: int
    stdout: str
    stderr: str
    truncated: bool
    isolation: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    killed_processes: int = 0
    as_root: bool = False
    limits: dict[str, Any] = dataclasses.field(default_factory=dict)
    supervisor_lost: bool = False

    @property
    def ok(self) -> bool:
        """``True`` only when ``status`` is exactly ``ok``."""
        return self.status is Status.OK

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the design's keys (``status`` as its exact string)."""
        # Every field is a scalar, a tuple of strings or the limits' flat dict of scalars: a copy one level deep is
        # dataclasses.asdict's result, at a twelfth of its cost (3 us against 38 us; it recurses into every value).
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data["limits"] = dict(self.limits)
        data["status"] = self.status.value
        data["isolation"] = list(self.isolation)
        data["notes"] = list(self.notes)
        return data

    def summary(self) -> str:
        """One line for people: ``status=ok exit=0 wall=0.03s cpu=0.02s peak=9.1M``.

        ``killed=N`` follows when processes the program left running were killed at its end.
        """
        from .limits import format_size

        ended = f"signal={self.signal}" if self.signal else f"exit={self.exit_code}"
        line = (
            f"status={self.status.value} {ended} wall={self.wall_time:.2f}s "
            f"cpu={self.cpu_time:.2f}s peak={format_size(self.peak_memory)}"
        )
        if self.killed_processes:
            line += f" killed={self.killed_processes}"
        if self.truncated:
            line += " (output truncated)"
        if self.as_root:
            line += " (ran as root: not contained)"
        return line
