"""Helpers for the sandbox tests: run Python code under limits and find survivors."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid

from cellbox.limits import Limits
from cellbox.outcome import Outcome
from cellbox.sandbox import run


def marker() -> str:
    """A unique word to put in a child's command line, so its survivors can be found."""
    return f"cellbox-test-{uuid.uuid4().hex}"


def run_python(code: str, mark: str | None = None, **options: object) -> Outcome:
    """Run ``code`` with this interpreter in the sandbox; ``mark`` goes into argv as a comment."""
    source = textwrap.dedent(code)
    if mark:
        source += f"\n# {mark}\n"
    limits = options.pop("limits", None) or Limits(wall_time=10, cpu_time=10, memory=512 * 1024**2)
    return run([sys.executable, "-c", source], limits=limits, **options)  # type: ignore[arg-type]


def survivors(mark: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``mark``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


def rss_bytes() -> int:
    """This process's current resident set size, bytes (from /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
