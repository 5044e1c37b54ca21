"""``cellbox doctor``: which isolation layers this machine supports, why one is missing, and what to do.

Each layer is tried for real, by starting bubblewrap with it, by loading a
seccomp filter in a child, by asking the kernel for Landlock (see
:func:`cellbox.sandbox.isolation.probe`); the reasons are the ones a run's
``Outcome.notes`` would give.  The report ends with what still protects a run
here and the one thing to do to get more.  Exit status 0 when every layer
works, 1 when some are missing, so a set-up script can check a machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from .sandbox.cgroups import UNBOUNDED_MEMORY
from .sandbox.isolation import BWRAP_LAYERS, LAYERS, UNPRIVILEGED_USER, Support, probe, socket_filter_missing

__all__ = ["add_parser", "doctor_report", "doctor_lines"]

# What each protection keeps from a program, for the report's "still protecting" line.
PROTECTS = {
    "net": "net (no network)",
    "pid": "pid (no other process in sight)",
    "fs": "fs (a view without your files)",
    "user": "user (no powers over the machine)",
    "landlock": "landlock (files outside the run out of reach)",
    "syscall_filter": "the syscall filter (sockets, System V IPC and user namespaces refused)",
}
ALWAYS = "rlimits, the environment allowlist and the process-tree kill"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``cellbox doctor`` (called by :func:`cellbox.cli.build_parser`)."""
    parser = subparsers.add_parser(
        "doctor",
        help="show which isolation layers this machine supports, why a layer is missing, and what to do",
        description="Try each isolation layer (net, pid, fs and user through bubblewrap; landlock; the syscall "
        "filter) and print what works here, what still protects a run, and the one thing to do to get more.",
        epilog="exit status: 0 every layer works; 1 some are missing; 2 bad input",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.set_defaults(func=_cmd_doctor)


def doctor_report(support: Support) -> dict[str, object]:
    """What ``cellbox doctor --json`` prints: bwrap, root, each layer's state, what protects, what to do.

    Keys: ``bwrap`` (path or ``None``), ``as_root``, ``user_namespaces``,
    ``layers`` (each ``{"available", "reason"}``), ``rlimits``, the
    :func:`extras`, ``protected_by`` (the protections a run gets here) and
    ``advice`` (the one thing to do for more, or ``None``).
    """
    more = extras(support)
    return {
        "bwrap": support.bwrap,
        "as_root": support.as_root,
        "user_namespaces": {"available": support.userns is None, "reason": support.userns},
        "layers": {
            layer: {"available": support.available(layer), "reason": support.missing.get(layer)} for layer in LAYERS
        },
        "rlimits": True,
        **more,
        "protected_by": protections(support, more),
        "advice": support.advice,
    }


def extras(support: Support) -> dict[str, dict[str, object]]:
    """The protections beside the layers: the syscall filter, the disk tmpfs, the memory cgroup.

    Each as ``{"available": bool, "reason": str | None}``; a missing one does not change the exit status.
    """
    from .sandbox.cgroups import memory_cgroup_root

    blocked = support.filter or socket_filter_missing()
    cgroup = memory_cgroup_root()
    if not support.available("fs"):
        disk = "it needs the fs layer, which is missing here (above)"
    elif not support.tmpfs_size:
        disk = (
            "this bwrap has no --size (bubblewrap 0.7 or later): the disk limit, and the size of a run's /tmp and "
            "/dev/shm (shared_memory), do not hold"
        )
    else:
        disk = None
    return {
        "syscall_filter": {"available": blocked is None, "reason": blocked},
        "disk_tmpfs": {"available": disk is None, "reason": disk},
        "memory_cgroup": {
            "available": cgroup is not None,
            "reason": None if cgroup else UNBOUNDED_MEMORY,
        },
    }


def protections(support: Support, more: dict[str, dict[str, object]]) -> list[str]:
    """The names (keys of :data:`PROTECTS`) of what protects a run here besides rlimits and the tree kill."""
    found = [layer for layer in LAYERS if support.available(layer)]
    return [*found, *(["syscall_filter"] if more["syscall_filter"]["available"] else [])]


def running_as(support: Support) -> str:
    """The ``running as:`` line: who cellbox is, and what the user layer makes of its children here."""
    if not support.as_root:
        if support.available("user"):
            return f"running as: uid {os.geteuid()} (with the user layer, children get a user namespace)"
        return f"running as: uid {os.geteuid()} (no user layer here: children run as this user, without a namespace)"
    if not support.available("user"):
        return "running as: root (no user layer here: children run as root)"
    kept = "of a user namespace of their own" if support.userns is None else "(no user namespace here)"
    return (
        f"running as: root (with the user layer, children run as {UNPRIVILEGED_USER}; `cellbox run` and the "
        f"kernel keep them at uid 0 {kept} with every capability dropped)"
    )


def doctor_lines(support: Support) -> list[str]:
    """The lines ``cellbox doctor`` prints for ``support``, from bubblewrap to what to do."""
    bwrap = _bwrap_version(support.bwrap) if support.bwrap else "not installed (apt-get install bubblewrap)"
    lines = [f"bubblewrap: {bwrap}"]
    lines.append(running_as(support))
    lines.append(f"user namespaces: {'yes' if support.userns is None else 'no: ' + support.userns}")
    # Layers that share a reason (all of bubblewrap's) say it once.
    said: dict[str, str] = {}
    for layer in LAYERS:
        why = support.missing.get(layer)
        if support.available(layer):
            state = "yes"
        elif why in said:
            state = f"no: {said[why]}"
        else:
            state = f"no: {why or 'bubblewrap cannot give it here'}"
            if why is not None and layer in BWRAP_LAYERS:
                said[why] = f"as for {layer}"
        lines.append(f"{layer:8} {state}")
    lines.append(f"{ALWAYS}: yes (always)")
    more = extras(support)
    for name, found in more.items():
        lines.append(f"{name.replace('_', ' ')}: {'yes' if found['available'] else 'no: ' + str(found['reason'])}")
    kept = [PROTECTS[name] for name in protections(support, more)]
    lines.append(f"still protecting every run: {ALWAYS}{''.join(', ' + item for item in kept)}")
    if support.advice:
        lines.append(f"to get more: {support.advice}")
    elif all(support.available(layer) for layer in LAYERS):
        lines.append("to get more: nothing; every layer works here")
    return lines


def _bwrap_version(bwrap: str) -> str:
    """``/usr/bin/bwrap (bubblewrap 0.8.0)``, or the path alone when ``--version`` says nothing."""
    try:
        done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return bwrap
    version = done.stdout.strip()
    return f"{bwrap} ({version})" if done.returncode == 0 and version else bwrap


def _cmd_doctor(args: argparse.Namespace) -> int:
    support = probe()
    if args.json:
        print(json.dumps(doctor_report(support)))
    else:
        print("\n".join(doctor_lines(support)))
    return 0 if all(support.available(layer) for layer in LAYERS) else 1
