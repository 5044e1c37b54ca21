"""Resource limits for one sandboxed run, and the parsing of sizes and times.

A :class:`Limits` value is what every front door (``cellbox run``, the kernel's
``%%limits`` line, ``cellbox grade``) hands to the sandbox core.  Each field is
defined once here, with its unit, default and the mechanism that enforces it;
the documentation's limits table (docs/reference/limits.md) is written from the same facts.

Mechanisms (see setrlimit(2), setpriority(2), ioprio_set(2)):

=============  ===========  ============================================
field          unit         enforced by
=============  ===========  ============================================
wall_time      seconds      the parent's deadline, then a kill of the tree
cpu_time       seconds      RLIMIT_CPU, soft n (SIGXCPU), hard n + 1 (SIGKILL)
memory         bytes        RLIMIT_AS (allocation fails: MemoryError)
output         bytes        the parent stops reading and kills the tree
file_size      bytes        RLIMIT_FSIZE (Python: EFBIG; others: SIGXFSZ)
shared_memory  bytes        the size of the run's own ``/tmp`` and ``/dev/shm`` tmpfs (bubblewrap's
                            ``--size``), counted in its memory cgroup where there is one
open_files     count        RLIMIT_NOFILE
processes      count        a pids cgroup when writable, else RLIMIT_NPROC
disk           bytes        a size-capped tmpfs over the task directory (bubblewrap's
                            ``--size``); without it, only RLIMIT_FSIZE per file
resident       bytes        a memory cgroup's limit (resident memory, tmpfs, memfds), when writable;
                            by default ``memory`` plus twice ``shared_memory`` (see :meth:`Limits.memory_bound`)
nice           0..19        setpriority(2)
io_class       name         ioprio_set(2): ``idle``, ``best-effort`` or ``none``
=============  ===========  ============================================
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Limits",
    "LimitError",
    "parse_size",
    "parse_time",
    "format_size",
    "format_time",
    "IO_CLASSES",
    "DEFAULT_CEILING",
]

IO_CLASSES = ("idle", "best-effort", "none")

_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_TIME_UNITS = {"": 1.0, "S": 1.0, "MS": 0.001, "M": 60.0, "MIN": 60.0, "H": 3600.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(_NUMBER + r"\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)
_TIME_RE = re.compile(_NUMBER + r"\s*(ms|s|m|min|h)?", re.IGNORECASE)


class LimitError(ValueError):
    """A limit was given a value that cannot be used.

    ``source`` names where the value came from (``--memory``, a ``%%limits``
    line, a config file) so the one-line message can point the user there.
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


def parse_size(text: str | int | float, *, source: str | None = None) -> int:
    """Parse a size such as ``256M``, ``1.5G``, ``64K``, ``4096`` into bytes.

    Units are binary (K = 1024 bytes); a trailing ``B``/``iB`` is accepted.

    Raises:
        LimitError: the text is not a non-negative size.
    """
    if isinstance(text, bool):
        raise LimitError(f"expected a size such as 256M, got {text!r}", source=source)
    if isinstance(text, (int, float)):
        if text < 0 or not math.isfinite(text):
            raise LimitError(f"a size cannot be {text!r}", source=source)
        return int(text)
    match = _SIZE_RE.fullmatch(text.strip())
    if not match:
        raise LimitError(
            f"{text!r} is not a size; write a number with an optional unit, such as 256M, 1.5G or 64K",
            source=source,
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def parse_time(text: str | int | float, *, source: str | None = None) -> float:
    """Parse a duration such as ``5``, ``2.5s``, ``500ms``, ``1m`` into seconds.

    Raises:
        LimitError: the text is not a positive duration.
    """
    if isinstance(text, bool):
        raise LimitError(f"expected a time such as 2.5s, got {text!r}", source=source)
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _TIME_RE.fullmatch(text.strip())
        if not match:
            raise LimitError(
                f"{text!r} is not a time; write seconds with an optional unit, such as 5, 2.5s or 1m",
                source=source,
            )
        seconds = float(match.group(1)) * _TIME_UNITS[(match.group(2) or "").upper()]
    if seconds <= 0 or not math.isfinite(seconds):
        raise LimitError(f"a time limit must be positive, got {text!r}", source=source)
    return seconds


def format_size(n: int) -> str:
    """Format bytes for people: ``268435456`` -> ``256M``."""
    for unit in ("T", "G", "M", "K"):
        scale = _SIZE_UNITS[unit]
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}".replace(".0" + unit, unit)
    return f"{n}B"


def format_time(seconds: float) -> str:
    """Format seconds for people: ``2.5`` -> ``2.5 s``."""
    return f"{seconds:g} s"


_SIZE_FIELDS = ("memory", "output", "file_size", "shared_memory", "disk", "resident")
# Size limits that may be switched off (None): "none" or "unlimited" in text.
_OPTIONAL_FIELDS = ("memory", "disk", "resident")
_TIME_FIELDS = ("wall_time", "cpu_time")
_COUNT_FIELDS = ("open_files", "processes")
# Short names accepted on a %%limits line and in other user-facing text.
ALIASES = {
    "wall": "wall_time",
    "cpu": "cpu_time",
    "mem": "memory",
    "fsize": "file_size",
    "files": "open_files",
    "nofile": "open_files",
    "nproc": "processes",
    "procs": "processes",
    "io": "io_class",
    "rss": "resident",
    "shm": "shared_memory",
}


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits of one sandboxed run.  Immutable; derive variants with :meth:`replace`.

    Attributes:
        wall_time: seconds of real time before the parent kills the whole tree.
        cpu_time: CPU seconds per process (RLIMIT_CPU soft; the hard limit is one
            second more, so a child that ignores SIGXCPU is SIGKILLed).
        memory: bytes of address space per process (RLIMIT_AS), or ``None`` for none.
        output: bytes of stdout plus stderr kept; more stops the run (``output_limit``).
        file_size: largest file a process may write, bytes (RLIMIT_FSIZE).  A shared
            memory segment or a memfd is a file too (ftruncate(2) past it fails
            with EFBIG), so the default is as large as ``shared_memory``.
        shared_memory: bytes of each of the run's own memory-backed folders,
            ``/tmp`` and ``/dev/shm`` (tmpfs: what the kernel counts as Shmem,
            where ``multiprocessing.shared_memory`` and PyTorch's DataLoader put
            their segments), with the ``fs`` layer; a write past it fails with
            ENOSPC.  What a run keeps there is memory, counted in its memory
            cgroup (see ``resident``) and not by RLIMIT_AS.
        open_files: open file descriptors per process (RLIMIT_NOFILE).
        processes: processes the run may have at once (pids cgroup when writable,
            else RLIMIT_NPROC counted on top of the user's current processes).
        disk: bytes a run may write in its task directory in total (its ``HOME``,
            ``TMPDIR``, and its working directory when that is the task's
            ``work/``), or ``None`` for no cap.  A size-capped tmpfs over the task
            directory (bubblewrap's ``--size``, the ``fs`` layer, a run that owns
            its task directory); a write past it fails with ENOSPC, and the
            Outcome's notes say the limit was reached.  Elsewhere only
            ``file_size`` holds, per file, and a note says the total is not capped.
        resident: bytes of resident memory (RAM, tmpfs, memfds, shared mappings,
            page cache of its writes) the whole run may use: a memory cgroup's
            limit, where one is writable (the kernel kills the run at the cap:
            ``memory_limit``).  ``None`` (the default) bounds the run at
            :meth:`memory_bound`.  Unlike ``memory`` it does not count address
            space reserved and never touched.  Where no memory cgroup is
            writable, a note says what is not bounded.
        nice: CPU niceness, 0 (normal) to 19 (lowest priority), see nice(1).
        io_class: I/O scheduling class, ``idle``, ``best-effort`` or ``none`` (unchanged).
    """

    wall_time: float = 30.0
    cpu_time: float = 30.0
    memory: int | None = 2 * 1024**3
    output: int = 1024**2
    file_size: int = 512 * 1024**2
    shared_memory: int = 512 * 1024**2
    open_files: int = 256
    processes: int = 128
    disk: int | None = None
    resident: int | None = None
    nice: int = 19
    io_class: str = "idle"

    def __post_init__(self) -> None:
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise LimitError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in _SIZE_FIELDS + _COUNT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_FIELDS:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LimitError(f"{name} must be a positive whole number, got {value!r}")
        if not isinstance(self.nice, int) or not 0 <= self.nice <= 19:
            raise LimitError(f"nice must be a whole number from 0 to 19, got {self.nice!r}")
        if self.io_class not in IO_CLASSES:
            raise LimitError(f"io_class must be one of {', '.join(IO_CLASSES)}, got {self.io_class!r}")

    def replace(self, **changes: Any) -> Limits:
        """Return a copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The limits as a JSON-ready dict with the design's field names."""
        # Every field is a number, a string or None: dataclasses.asdict would copy each value again.
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def updated(self, values: Mapping[str, Any], *, source: str | None = None) -> Limits:
        """Return a copy with fields parsed from text, as typed by a user.

        ``values`` maps a field name (or a short alias such as ``wall``, ``cpu``,
        ``mem``) to text (``"256M"``, ``"2.5s"``) or a number.  ``memory``,
        ``disk`` and ``resident`` also accept ``none``/``unlimited``.

        Raises:
            LimitError: an unknown name or a bad value; the message names ``source``.
        """
        changes: dict[str, Any] = {}
        for raw_name, raw_value in values.items():
            name = ALIASES.get(raw_name, raw_name).replace("-", "_")
            # A flag such as --memory names the limit already; a %%limits line does not.
            where = source if source and source.startswith("--") else f"{source} ({raw_name})" if source else raw_name
            if name in _TIME_FIELDS:
                changes[name] = parse_time(raw_value, source=where)
            elif name in _SIZE_FIELDS:
                if name in _OPTIONAL_FIELDS and str(raw_value).strip().lower() in ("none", "unlimited"):
                    changes[name] = None
                else:
                    changes[name] = parse_size(raw_value, source=where)
            elif name in _COUNT_FIELDS + ("nice",):
                try:
                    changes[name] = int(str(raw_value).strip())
                except ValueError:
                    raise LimitError(f"{raw_value!r} is not a whole number", source=where) from None
            elif name == "io_class":
                changes[name] = str(raw_value).strip()
            else:
                known = ", ".join(f.name for f in dataclasses.fields(Limits))
                raise LimitError(f"unknown limit {raw_name!r}; known limits: {known}", source=source)
        try:
            return self.replace(**changes)
        except LimitError as exc:
            raise LimitError(str(exc), source=source) from None

    def memory_bound(self) -> int | None:
        """Bytes of memory the whole run may hold (its memory cgroup's limit), or ``None`` for no bound.

        ``resident`` when given; else ``memory`` (one process's address space)
        plus the two tmpfs of ``shared_memory`` bytes, which RLIMIT_AS does not
        count; ``None`` when ``memory`` is ``None`` too.
        """
        if self.resident is not None:
            return self.resident
        if self.memory is None:
            return None
        return self.memory + 2 * self.shared_memory

    def capped(self, ceiling: Limits) -> tuple[Limits, list[str]]:
        """These limits lowered to ``ceiling`` wherever they ask for more; and the names that asked.

        A size or a count asks for more when it is larger (``None``, no limit,
        is larger than any); ``nice`` when it is lower (a higher priority,
        setpriority(2)); ``io_class`` when it comes later in :data:`IO_CLASSES`
        (``none`` keeps the kernel's own class, the highest).  A ``None`` in the
        ceiling lets anything through.
        """
        changes: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            name = field.name
            mine, top = getattr(self, name), getattr(ceiling, name)
            if name == "nice":
                over = mine < top
            elif name == "io_class":
                over = IO_CLASSES.index(mine) > IO_CLASSES.index(top)
            elif top is None:
                over = False
            else:
                over = mine is None or mine > top
            if over:
                changes[name] = top
        return (self.replace(**changes) if changes else self), list(changes)

    def widened(self, other: Limits) -> Limits:
        """This ceiling raised to ``other`` wherever ``other`` asks for more (see :meth:`capped`)."""
        _capped, over = other.capped(self)
        return self.replace(**{name: getattr(other, name) for name in over}) if over else self

    def describe(self) -> str:
        """One line for people: ``wall 30 s, cpu 30 s, memory 2G, output 1M``."""
        memory = format_size(self.memory) if self.memory is not None else "unlimited"
        return (
            f"wall {format_time(self.wall_time)}, cpu {format_time(self.cpu_time)}, "
            f"memory {memory}, output {format_size(self.output)}"
        )


# The kernel's ceiling when its administrator sets none (docs/reference/settings.md): what one student's cell may
# ask for on a shared server.  A %%limits line may lower anything, and raise only up to these.
DEFAULT_CEILING = Limits(
    wall_time=3600.0,
    cpu_time=3600.0,
    memory=4 * 1024**3,
    output=16 * 1024**2,
    file_size=1024**3,
    shared_memory=1024**3,
    open_files=1024,
    processes=256,
    nice=19,
    io_class="idle",
)


def limits_text(limits: Limits) -> str:
    """``limits`` as the ``NAME=VALUE`` words of a ``%%limits`` line (``wall=1h memory=4G ...``), unset ones left out.

    What ``cellbox install --help`` states as the default ceiling, so the words and the ceiling cannot part.
    """
    names = {"wall_time": "wall", "cpu_time": "cpu"}
    words = []
    for field in dataclasses.fields(limits):
        value = getattr(limits, field.name)
        if value is None:
            continue
        if field.name in ("wall_time", "cpu_time"):
            hours, minutes = divmod(value, 3600), divmod(value, 60)
            shown = f"{hours[0]:g}h" if not hours[1] else f"{minutes[0]:g}m" if not minutes[1] else f"{value:g}s"
        elif isinstance(value, int) and field.name not in ("open_files", "processes", "nice"):
            shown = format_size(value)
        else:
            shown = str(value)
        words.append(f"{names.get(field.name, field.name)}={shown}")
    return " ".join(words)
