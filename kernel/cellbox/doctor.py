"""``cellbox doctor``: which isolation layers this machine supports, and why one is missing.

Each layer is tried for real, by starting bubblewrap with it (see
:func:`cellbox.sandbox.isolation.probe`); the reasons are the ones a run's
``Outcome.notes`` would give.  Exit status 0 when every layer works, 1 when
some are missing, so a set-up script can check a machine.
"""

from __future__ import annotations

import argparse
import json
import os

from .sandbox.cgroups import UNBOUNDED_MEMORY
from .sandbox.isolation import LAYERS, UNPRIVILEGED_USER, Support, probe, socket_filter_missing

__all__ = ["add_parser", "doctor_report"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``cellbox doctor`` (called by :func:`cellbox.cli.build_parser`)."""
    parser = subparsers.add_parser(
        "doctor",
        help="show which isolation layers this machine supports, and why a layer is missing",
        description="Try each isolation layer (net, pid, fs and user through bubblewrap; landlock) and print "
        "what works here.",
        epilog="exit status: 0 every layer works; 1 some are missing; 2 bad input",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.set_defaults(func=_cmd_doctor)


def doctor_report(support: Support) -> dict[str, object]:
    """What ``cellbox doctor --json`` prints: bwrap, root, and each layer's state."""
    return {
        "bwrap": support.bwrap,
        "as_root": support.as_root,
        "layers": {
            layer: {"available": support.available(layer), "reason": support.missing.get(layer)} for layer in LAYERS
        },
        "rlimits": True,
        **extras(support),
    }


def extras(support: Support) -> dict[str, dict[str, object]]:
    """The protections beside the layers: the syscall filter, the disk tmpfs, the memory cgroup.

    Each as ``{"available": bool, "reason": str | None}``; a missing one does not change the exit status.
    """
    from .sandbox.cgroups import memory_cgroup_root

    blocked = socket_filter_missing()
    cgroup = memory_cgroup_root()
    return {
        "syscall_filter": {"available": blocked is None, "reason": blocked},
        "disk_tmpfs": {
            "available": support.tmpfs_size,
            "reason": None
            if support.tmpfs_size
            else "bwrap has no --size (bubblewrap 0.7 or later): the disk limit, and the size of a run's /tmp and "
            "/dev/shm (shared_memory), do not hold",
        },
        "memory_cgroup": {
            "available": cgroup is not None,
            "reason": None if cgroup else UNBOUNDED_MEMORY,
        },
    }


def _cmd_doctor(args: argparse.Namespace) -> int:
    support = probe()
    if args.json:
        print(json.dumps(doctor_report(support)))
    else:
        print(f"bubblewrap: {support.bwrap or 'not installed (apt-get install bubblewrap)'}")
        if support.as_root:
            print(f"running as: root (with the user layer, children run as {UNPRIVILEGED_USER})")
        else:
            print(f"running as: uid {os.geteuid()} (with the user layer, children get a user namespace)")
        for layer in LAYERS:
            state = "yes" if support.available(layer) else f"no: {support.missing.get(layer)}"
            print(f"{layer:8} {state}")
        print("rlimits, environment allowlist, process-tree kill: yes (always)")
        for name, found in extras(support).items():
            print(f"{name.replace('_', ' ')}: {'yes' if found['available'] else 'no: ' + str(found['reason'])}")
    return 0 if all(support.available(layer) for layer in LAYERS) else 1
