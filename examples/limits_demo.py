"""A tour of the limits from inside the sandbox.

Run it with::

    cellbox run --cpu 1 --memory 256M examples/limits_demo.py

Each step does something a limit forbids and prints what the operating system
did about it.  Every limit answers with an error this program can catch, and it
catches each one, so the run itself ends with status ``ok`` (the last line says
so); without the catching, the same steps end the run as ``memory_limit``,
``cpu_limit`` and so on (see docs/reference/statuses.md).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import time

MIB = 1024**2


def show(label: str, text: str) -> None:
    print(f"{label:<14} {text}")


def describe(limit: int, unit: str) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else f"{limit} {unit}".rstrip()


def show_limits() -> None:
    """What the launcher set with setrlimit(2) before it started this program."""
    for name, unit in (("RLIMIT_CPU", "s"), ("RLIMIT_AS", "bytes"), ("RLIMIT_FSIZE", "bytes"), ("RLIMIT_NOFILE", "")):
        soft, hard = resource.getrlimit(getattr(resource, name))
        show(name, f"soft {describe(soft, unit)}, hard {describe(hard, unit)}")
    show("nice", str(os.getpriority(os.PRIO_PROCESS, 0)))


def show_environment() -> None:
    """Only allowlisted names reach a child; HOME and TMPDIR are a throwaway task directory."""
    show("environment", ", ".join(sorted(os.environ)))
    show("HOME", os.environ.get("HOME", "(unset)"))


def try_memory() -> None:
    """Ask for twice the address-space limit: RLIMIT_AS makes the allocation fail."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        show("memory", "no RLIMIT_AS set; skipped (pass --memory 256M)")
        return
    try:
        block = bytearray(2 * soft)
    except MemoryError:
        show("memory", f"asked for {2 * soft // MIB} MiB: MemoryError (RLIMIT_AS)")
    else:
        show("memory", f"got {len(block) // MIB} MiB: the limit did not hold")


def try_big_file() -> None:
    """Write past the file-size limit: RLIMIT_FSIZE makes the write fail with EFBIG."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        show("file size", "no RLIMIT_FSIZE set; skipped")
        return
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "big.bin")
    chunk = b"x" * MIB
    written = 0
    try:
        with open(path, "wb", buffering=0) as file:
            # A sparse start, just short of the limit: the write that crosses it fails, without the time (and
            # the CPU, counted against RLIMIT_CPU) of writing hundreds of MiB first.
            file.seek(max(0, soft - MIB))
            while written <= soft:
                written = file.tell() + file.write(chunk)
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
        show("file size", f"stopped at {written // MIB} MiB: {errno.errorcode[exc.errno]} (RLIMIT_FSIZE)")
    finally:
        os.remove(path)


# Set by the SIGXCPU handler below; the handler is installed first thing (main), because the soft CPU limit
# counts from the program's start: on a busy machine the steps before the spin may use most of it.
sigxcpu_at: float | None = None


def on_sigxcpu(signum: int, frame: object) -> None:
    global sigxcpu_at
    sigxcpu_at = time.process_time()


def try_spinning() -> None:
    """Spin until the soft CPU limit sends SIGXCPU; the hard limit, one second later, would SIGKILL."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft == resource.RLIM_INFINITY or soft > 5:
        show("cpu", f"RLIMIT_CPU is {describe(soft, 's')}; spinning skipped (pass --cpu 1)")
        return
    while sigxcpu_at is None:
        pass
    show("cpu", f"SIGXCPU after {sigxcpu_at:.1f} s of CPU (RLIMIT_CPU)")


def main() -> None:
    signal.signal(signal.SIGXCPU, on_sigxcpu)
    show_limits()
    show_environment()
    try_memory()
    try_big_file()
    try_spinning()
    show(
        "why ok",
        "each limit made one step fail and this program caught the error, so the run ends ok; "
        "uncaught, they end it as memory_limit or cpu_limit",
    )


if __name__ == "__main__":
    main()
