"""How a run ended: the one :class:`~cellbox.sandbox.outcome.Status` of a run, from what happened to it.

The order of precedence is the design's (see :func:`classify`); the phrases
below are how programs report a memory limit they hit without dying of a
signal.
"""

from __future__ import annotations

import re
import signal

from .limits import Limits, format_size
from .outcome import Status

__all__ = ["classify", "ends_in_memory_error", "failed_reservation", "reservation_note", "RESERVATION_FAILURES"]

# The last line of a traceback for an uncaught MemoryError or a subclass named for it, of any module:
# numpy's ``numpy.core._exceptions._ArrayMemoryError: Unable to allocate ...`` (Python's traceback
# names the class with its module, traceback.TracebackException).
MEMORY_ERROR_RE = re.compile(r"^(?:[\w.]+\.)?\w*MemoryError\b")
# Signals a process dies of when it runs out of memory: the OOM killer's, and allocators' own aborts.
MEMORY_SIGNALS = {signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS}

# What programs print instead of a MemoryError when RLIMIT_AS refuses them:
# OpenBLAS's buffers at numpy's import (in every cell once numpy is in the
# carried state), and the dynamic loader mapping a library (an ImportError).
LIBRARY_OUT_OF_MEMORY = (
    "OpenBLAS error: Memory allocation still failed",
    "failed to map segment from shared object",
)


# What programs print when RLIMIT_AS refuses to *reserve* address space they
# may never use: a thread's stack (Python's "can't start new thread"; with the
# processes limit hit it reads the same, so the pids cgroup is asked first), a
# JIT's code range (V8: "Fatal process OOM in Failed to reserve virtual memory
# for CodeRange"), a runtime's heap (the JVM, Go).
RESERVATION_FAILURES = (
    "can't start new thread",
    "Failed to reserve virtual memory",
    "Could not reserve enough space for",
    "There is insufficient memory for the Java Runtime Environment",
    "Could not allocate compressed class space",
    "Cannot allocate Wasm memory",
    "fatal error: out of memory",
)
# What a program that says it could not reserve memory needs, for the note of its phrase: the limit it
# starts under, and the flags that make it reserve less.  The JVM reserves 1 GiB of class space beside
# its heap (java(1): -Xmx, -XX:CompressedClassSpaceSize); V8 reserves a 10 GiB guard region for every
# Wasm memory unless its trap handler is off (node(1): --disable-wasm-trap-handler, Node.js 20 and later).
JVM_FLAGS = "java -Xmx256m -XX:CompressedClassSpaceSize=64m"
RESERVATION_NEEDS = {
    "Could not reserve enough space for": ("4G", JVM_FLAGS),
    "There is insufficient memory for the Java Runtime Environment": ("4G", JVM_FLAGS),
    "Could not allocate compressed class space": ("4G", JVM_FLAGS),
    "Cannot allocate Wasm memory": ("12G", "node --disable-wasm-trap-handler"),
}


def failed_reservation(stderr: str, limits: Limits, threads_refused: bool | None = False) -> str | None:
    """A failure to reserve memory under the memory limit that ``stderr`` reports, or ``None``.

    The phrase of :data:`RESERVATION_FAILURES` in the tail of ``stderr``, only
    with a memory limit.  A thread that cannot start is put down to the
    processes limit instead when the run's pids cgroup counted a refused fork
    (``threads_refused``: ``pids.events``, cgroup-v1/pids.rst); ``None`` there
    means it is not known, and the phrase says it may be either.
    """
    tail = stderr[-4096:]
    phrase = next((phrase for phrase in RESERVATION_FAILURES if phrase in tail), None) if limits.memory else None
    if phrase != "can't start new thread":
        return phrase
    if threads_refused is None:
        return f"{phrase}, or the processes limit: RLIMIT_NPROC refuses a thread the same way"
    return None if threads_refused else phrase


def reservation_note(reservation: str, limits: Limits) -> str:
    """The run's note for a failed reservation (from :func:`failed_reservation`) under ``limits.memory``.

    Names the cap, the flag that raises it (to what the program is known to need, else twice the cap),
    and, for a runtime that can reserve less (:data:`RESERVATION_NEEDS`), its own flags.
    """
    cap = limits.memory or 0
    needs = next((needs for phrase, needs in RESERVATION_NEEDS.items() if reservation.startswith(phrase)), None)
    size, smaller = needs if needs else (format_size(2 * cap), None)
    return (
        f"memory: the program could not reserve address space under its {format_size(cap)} limit ({reservation}); "
        "RLIMIT_AS counts what is reserved (thread stacks, a JIT's code range, a runtime's heap), not only what is "
        f"used: raise the limit (cellbox run --memory {size}, or %%limits memory={size} in a cell)"
        + (f", or let the program reserve less: {smaller}" if smaller else "")
    )


def ends_in_memory_error(stderr: str) -> bool:
    """``True`` when ``stderr`` ends in an uncaught MemoryError, or holds a library's out-of-memory message."""
    tail = stderr[-4096:]
    lines = [line for line in tail.splitlines() if line.strip()]
    if lines and MEMORY_ERROR_RE.match(lines[-1]):
        return True
    return any(message in tail for message in LIBRARY_OUT_OF_MEMORY)


def classify(
    *,
    parent_action: Status | None,
    exit_code: int | None,
    signum: int | None,
    command_cpu: float,
    peak_memory: int,
    limits: Limits,
    memory_error: bool,
) -> Status:
    """Decide the one status of a run, in the design's order of precedence.

    What the parent did comes first (``interrupted``, ``timed_out``,
    ``output_limit``); then what the OS did at a limit (``cpu_limit``: SIGXCPU,
    or SIGKILL with the command's CPU time at the limit; ``memory_limit``: an
    uncaught MemoryError, or a fatal signal with peak memory near the cap);
    then ``crashed`` (any other signal); then ``error`` (non-zero exit); else ``ok``.
    """
    if parent_action is not None:
        return parent_action
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and command_cpu >= limits.cpu_time - 0.05):
        return Status.CPU_LIMIT
    if memory_error and (exit_code not in (0, None) or signum is not None):
        return Status.MEMORY_LIMIT
    if signum in MEMORY_SIGNALS and limits.memory and peak_memory >= 0.9 * limits.memory:
        return Status.MEMORY_LIMIT
    if signum is not None:
        return Status.CRASHED
    if exit_code:
        return Status.ERROR
    return Status.OK
