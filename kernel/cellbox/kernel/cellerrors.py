"""The words a student sees when the sandbox stopped a cell: an error name and one sentence.

The kernel turns a run's :class:`~cellbox.sandbox.outcome.Outcome` into an ``error``
message with these; the documentation's table of cell errors (docs/kernel.md) is written from them.
"""

from __future__ import annotations

from ..sandbox.limits import Limits, format_size, format_time
from ..sandbox.outcome import Outcome, Status
from ..sandbox.runs import SESSION_BOUND_NOTE

__all__ = ["error_for_outcome", "exit_reason"]

# Human names of the signals a crashed cell most often dies of.
_SIGNAL_WORDS = {
    "SIGSEGV": "a segmentation fault: the process touched memory it does not own",
    "SIGABRT": "an abort: a library found itself in an impossible state",
    "SIGBUS": "a bus error: a bad memory access",
    "SIGFPE": "an arithmetic error in compiled code",
    "SIGKILL": "SIGKILL, sent by something outside the cell (for example the system's out-of-memory killer)",
    "SIGTERM": "SIGTERM, a request to stop from outside the cell",
    "SIGILL": "an illegal instruction in compiled code",
}


def _processes(n: int) -> str:
    return "1 process" if n == 1 else f"{n} processes"


def _stopped(outcome: Outcome) -> str:
    """``it was stopped`` or ``it and the 3 processes it started were stopped``."""
    if outcome.killed_processes:
        return f"it and the {_processes(outcome.killed_processes)} it started were stopped"
    return "it was stopped"


def error_for_outcome(outcome: Outcome, limits: Limits, kept: bool = False) -> tuple[str, str] | None:
    """The ``(ename, evalue)`` a student sees for a run that hit a limit or crashed.

    Returns ``None`` for ``ok`` and ``error`` (the cell's own exception is shown
    then).  The words follow the documentation's status table.  A cell is said to be
    "stopped" only when it was (killed: the kernel then drops what it changed and says
    so); ``kept`` is the kernel's word that the state the cell left is the next cell's
    (a MemoryError ended it in its own process), and the words say that too.
    """
    status = outcome.status
    if status is Status.TIMED_OUT:
        return "CellTimeoutError", (
            f"the cell ran past its {format_time(limits.wall_time)} wall-clock limit; {_stopped(outcome)}. "
            f"If it needs longer, put %%limits wall={_twice(limits.wall_time)} on the cell's first line"
        )
    if status is Status.CPU_LIMIT:
        return "CellCPULimitError", (
            f"the cell used up its {format_time(limits.cpu_time)} of CPU time (RLIMIT_CPU) and was stopped. "
            f"If the work is meant to be that long, put %%limits cpu={_twice(limits.cpu_time)} on the cell's first line"
        )
    if status is Status.MEMORY_LIMIT:
        return "CellMemoryLimitError", _memory_words(outcome, limits, kept)
    if status is Status.OUTPUT_LIMIT:
        return "CellOutputLimitError", (
            f"the cell printed more than its {format_size(limits.output)} output limit; {_stopped(outcome)}. "
            "Print less (a summary, or the first lines), or put "
            f"%%limits output={format_size(limits.output * 4)} on the cell's first line"
        )
    if status is Status.INTERRUPTED:
        return "KeyboardInterrupt", "the cell was interrupted"
    if outcome.supervisor_lost and status is not Status.INTERRUPTED:
        return "CellCrashedError", (
            "the cell's supervisor was killed before it could report (perhaps by the cell itself), so how the "
            f"cell ended is unknown; {_processes(outcome.killed_processes)} of the cell that could still be found "
            "were stopped, and others may have escaped; the kernel is still alive"
        )
    if status is Status.CRASHED:
        name = outcome.signal or "a signal"
        words = _SIGNAL_WORDS.get(name, name)
        return "CellCrashedError", f"the cell's process was ended by {name} ({words}); the kernel is still alive"
    return None


def _memory_words(outcome: Outcome, limits: Limits, kept: bool) -> str:
    """What happened to a ``memory_limit`` cell: a MemoryError ended it, or a signal at the cap stopped it."""
    state = _KEPT if kept else ""
    session = next((note for note in outcome.notes if note.startswith(SESSION_BOUND_NOTE)), None)
    if session is not None:
        bound = session.removeprefix(SESSION_BOUND_NOTE).split(" (", 1)[0].removeprefix(" of ")
        return (
            f"the cell was stopped: the session's memory reached its {bound} bound and the system killed the cell's "
            "process. The bound counts every cell, the earlier states kept for %undo and what cells keep in /tmp and "
            "/dev/shm together; %%limits does not raise it. Restarting the kernel frees the kept states; "
            "CellboxKernel.session_memory, an administrator's setting, raises the bound"
        )
    if limits.memory is None:
        if outcome.signal is None:
            return f"the cell asked for more memory than the machine could give: a MemoryError ended it{state}"
        return f"the cell was stopped: its process was ended by {outcome.signal} when the machine ran out of memory"
    cap = format_size(limits.memory)
    more = f"If the cell really needs more, put %%limits memory={_more_memory(limits.memory)} on its first line"
    if outcome.signal is None:
        return (
            f"the cell asked for more memory than its {cap} limit allows: the allocation failed with MemoryError, "
            f"which ended the cell{state}. The limit caps the address space of each process (RLIMIT_AS). " + more
        )
    return (
        f"the cell was stopped: its process was ended by {outcome.signal} at its {cap} memory limit (RLIMIT_AS "
        "caps the address space of each process; code that cannot allocate may abort instead of raising "
        f"MemoryError). {more}"
    )


# After a MemoryError that ended a cell in its own process: its names live on, memory and all.
_KEPT = "; what it defined before is kept, with the memory it holds"


def exit_reason(outcome: Outcome) -> str:
    """Why a cell's process ended without an exception: the launcher's reason when it could not start."""
    last = outcome.stderr.rstrip("\n").rpartition("\n")[2]
    if outcome.exit_code in (126, 127) and last.startswith("cellbox: "):
        return f"the cell could not start: {last.removeprefix('cellbox: ')}"
    return f"the cell's process ended with exit status {outcome.exit_code} before the cell finished"


def _twice(seconds: float) -> str:
    return f"{seconds * 2:g}"


def _more_memory(memory: int | None) -> str:
    return format_size((memory or 0) * 2)
