"""Command-line options for limits, shared by ``cellbox run``, ``grade`` and ``install``.

Each option maps to one :class:`~cellbox.sandbox.limits.Limits` field; values are
parsed by the same functions as a ``%%limits`` line, so a bad value gives the
same one-line error wherever it is typed.
"""

from __future__ import annotations

import argparse
from typing import Any

from .sandbox.limits import Limits, format_size, format_time

__all__ = ["add_limit_options", "limits_from_args", "format_default"]

# (flag, field, metavar, help)
LIMIT_OPTIONS = (
    ("--wall", "wall_time", "SECONDS", "wall-clock limit, e.g. 10 or 2.5s"),
    ("--cpu", "cpu_time", "SECONDS", "CPU-time limit per process (RLIMIT_CPU)"),
    ("--memory", "memory", "SIZE", "address-space limit per process (RLIMIT_AS), e.g. 256M, 1.5G, or none"),
    ("--output", "output", "SIZE", "bytes of stdout+stderr kept before the run is stopped, e.g. 100K"),
    ("--file-size", "file_size", "SIZE", "largest file a process may write (RLIMIT_FSIZE)"),
    (
        "--shared-memory",
        "shared_memory",
        "SIZE",
        "size of the run's own /tmp and /dev/shm (tmpfs, counted as the run's memory), e.g. 1G",
    ),
    ("--open-files", "open_files", "N", "open file descriptors per process (RLIMIT_NOFILE)"),
    ("--processes", "processes", "N", "processes and threads the run may have at once"),
    (
        "--disk",
        "disk",
        "SIZE",
        "total bytes the run may write in its task directory (HOME, TMPDIR; a size-capped tmpfs with "
        "bubblewrap, else only --file-size per file), e.g. 256M, or none",
    ),
    (
        "--resident",
        "resident",
        "SIZE",
        "memory the whole run may hold: resident, tmpfs, memfds (a memory cgroup, where writable; reserved "
        "but untouched address space does not count), e.g. 100M; unset, the bound is --memory plus twice "
        "--shared-memory",
    ),
    ("--nice", "nice", "N", "CPU niceness, 0 (normal) to 19 (the lowest priority)"),
    ("--io-class", "io_class", "CLASS", "I/O scheduling class: idle, best-effort or none"),
)


def add_limit_options(parser: argparse.ArgumentParser, defaults: Limits | None = None) -> None:
    """Add ``--wall``, ``--cpu``, ``--memory`` ... to ``parser``; help shows the defaults."""
    defaults = defaults or Limits()
    group = parser.add_argument_group("limits")
    for flag, field, metavar, text in LIMIT_OPTIONS:
        group.add_argument(
            flag,
            dest=f"limit_{field}",
            metavar=metavar,
            default=None,
            help=f"{text} (default: {format_default(field, getattr(defaults, field))})",
        )


def format_default(field: str, value: Any) -> str:
    """A limit's value as people write it in ``--help``: ``2G``, ``30 s``, ``none``, ``256``."""
    if value is None:
        return "none"
    if field in ("memory", "output", "file_size", "shared_memory", "disk", "resident"):
        return format_size(int(value))
    if field in ("wall_time", "cpu_time"):
        return format_time(float(value))
    return str(value)


def limits_from_args(args: argparse.Namespace, base: Limits | None = None) -> Limits:
    """Build :class:`Limits` from parsed options over ``base``.

    Raises:
        LimitError: a value could not be parsed; the message names the flag.
    """
    base = base or Limits()
    for flag, field, _metavar, _help in LIMIT_OPTIONS:
        value = getattr(args, f"limit_{field}", None)
        if value is not None:
            base = base.updated({field: value}, source=flag)
    return base
