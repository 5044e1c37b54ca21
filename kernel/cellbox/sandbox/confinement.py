"""The walls of a run, set up before it starts: namespaces, Landlock, the syscall filter, cgroups, the disk tmpfs.

:class:`Confinement` is the part of :class:`~cellbox.sandbox.runs.Run` that
turns the run's :class:`~cellbox.sandbox.isolation.Plan` and limits into the
launcher's spec (the bwrap command in front of it, the Landlock rules, the
seccomp filter, the pids and memory cgroups it joins), and says in the run's
notes what could not be had.  A run forked from a session gets the session's
walls instead (see :mod:`cellbox.sandbox.session`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from .cgroups import MemoryCgroup, PidsCgroup, memory_cgroup_root, pids_cgroup_root
from .environment import TaskDirectory, strip_setid_bits
from .isolation import (
    BWRAP_LAYERS,
    REFUSAL_WORDS,
    Isolation,
    Plan,
    bwrap_prefix,
    count_user_tasks,
    landlock_rules,
    probe,
    socket_filter,
    socket_filter_missing,
    walls_refused,
)
from .limits import Limits, format_size

__all__ = ["Confinement"]


class Confinement:
    """The walls of one :class:`~cellbox.sandbox.runs.Run` (a mixin: the run holds the state named below)."""

    limits: Limits
    isolation: Isolation
    task: TaskDirectory
    _own_task: bool
    _notes: list[str]
    _isolation: list[str]
    _cgroup: PidsCgroup | None
    _memory_cgroup: MemoryCgroup | None
    _disk_watched: bool
    _workdir: str

    def _isolate(self, plan: Plan, spec: dict[str, Any], argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """The bwrap command in front of the launcher, the Landlock rules, and the run's report of the layers."""
        programs = [sys.executable, str(argv[0])]
        prefix: list[str] = []
        # Isolated runs never regain powers through a set-user-ID program (prctl(2) PR_SET_NO_NEW_PRIVS).
        spec["no_new_privs"] = True
        if set(plan.layers) & set(BWRAP_LAYERS) and probe().bwrap_usable:
            prefix = bwrap_prefix(
                plan,
                probe(),
                self.isolation,
                programs=programs,
                cwd=spec["cwd"],
                task=str(self.task.path),
                cgroup=spec.get("cgroup"),
                tmpfs_bytes=self.limits.shared_memory,
                path=env["PATH"],
                task_size=self._task_tmpfs_size(plan, spec["cwd"]),
                cgroups=spec.get("cgroups", []),
            )
        if not prefix and "user" in plan.layers and plan.user is None and self.isolation.keep_root:
            # Root kept at uid 0 without bubblewrap's user namespace: its capabilities go in the launcher.
            spec["drop_caps"] = True
        if "syscall-filter" in plan.layers:
            spec["seccomp"] = socket_filter(*plan.sockets, refuse=plan.refuse).hex()
        if "landlock" in plan.layers:
            spec["landlock"] = landlock_rules(
                self.isolation, plan, programs=programs, cwd=spec["cwd"], task=str(self.task.path), path=env["PATH"]
            )
        self._isolation += plan.layers
        uid = spec.get("uid")
        if uid is not None and uid != os.geteuid():
            if "pid" in plan.layers and "nproc_extra" in spec:
                # RLIMIT_NPROC counts the uid's tasks on the whole machine; the
                # launcher sees only its namespace, so count for it here.
                spec["nproc_base"] = count_user_tasks(uid)
            if not writable_by(spec["cwd"], uid, spec.get("groups") or []):
                self._notes.append(
                    f"fs: the working directory {spec['cwd']} is not writable by {spec.get('user')} (uid {uid})"
                )
        return prefix

    def _hold_walls(self, spec: dict[str, Any]) -> list[str]:
        """The filter of a run with isolation ``none``: the walls every run holds (:func:`walls_refused`).

        No namespace, no Landlock: only the refusals no layer gives (ptrace and
        its kin, set-user-ID files, file capabilities for root), with
        ``no_new_privs``, which seccomp(2) needs without CAP_SYS_ADMIN.  Where
        the filter cannot be had the run's notes say what is then open (design
        rule 8).  Returns the bwrap prefix: none.
        """
        refused = walls_refused(os.geteuid() == 0)
        blocked = socket_filter_missing()
        if blocked is not None:
            self._notes.append(
                f"syscall filter: not applied ({blocked}): {', '.join(REFUSAL_WORDS[g] for g in refused)}"
            )
            return []
        spec["no_new_privs"] = True
        spec["seccomp"] = socket_filter(False, False, refuse=refused, basic=False).hex()
        self._isolation.append("syscall-filter")
        return []

    def _strip_setid_files(self) -> None:
        """As root on a machine without a syscall filter: take the set-user-ID bits off what the run left.

        Where the filter refuses making such files this does nothing; where it
        cannot be loaded, a root run could leave one in its writable folders
        (the working directory, the task directory, ``writable`` paths), so those
        are swept after it ends (:func:`~cellbox.sandbox.environment.strip_setid_bits`).
        """
        if os.geteuid() != 0 or socket_filter_missing() is None:
            return
        folders = [self._workdir, str(self.task.path), *self.isolation.writable]
        changed = strip_setid_bits([f for f in folders if f and f != "/"])
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            self._notes.append(f"fs: set-user-ID and set-group-ID bits the run left were removed: {shown}")

    def _task_tmpfs_size(self, plan: Plan, cwd: str) -> int | None:
        """The size of the tmpfs over the task directory (the ``disk`` limit), or ``None`` for none.

        Only with the ``fs`` layer and bwrap's ``--size``, for a run that owns its
        task directory (a caller's task holds files it put there and reads back),
        and whose working directory is the task's ``work/`` or outside the task.
        """
        task = str(self.task.path)
        inside = cwd == task or cwd.startswith(task + os.sep)
        if (
            self.limits.disk is None
            or not self._own_task
            or "fs" not in plan.layers
            or not probe().tmpfs_size
            or (inside and cwd != str(self.task.work))
        ):
            return None
        self._disk_watched = True
        return self.limits.disk

    def _note_disk_limit(self, spec: dict[str, Any], prefix: list[str]) -> None:
        """Watch the task tmpfs (the supervisor reports whether it filled), or say why the total is not capped."""
        if self.limits.disk is None:
            return
        if prefix and self._disk_watched:
            spec["disk_watch"] = str(self.task.path)
            self._isolation.append("disk-tmpfs")
            task = str(self.task.path)
            if not (spec["cwd"] == task or spec["cwd"].startswith(task + os.sep)):
                self._notes.append(
                    f"disk: the working directory {spec['cwd']} is outside the task directory: its total is not "
                    f"capped there, file_size caps each file at {format_size(self.limits.file_size)}"
                )
            return
        self._disk_watched = False
        if not self._own_task:
            why = "the run writes a task directory its caller gave, which is kept"
        else:
            why = "a size-capped tmpfs needs the fs layer: isolation auto with bubblewrap 0.7 or later"
        self._notes.append(
            f"disk: the total written is not capped ({why}); file_size caps each file at "
            f"{format_size(self.limits.file_size)}"
        )

    def _note_session_wide_limits(self) -> None:
        """A run forked from a session shares the session's task directory and cgroups: say what does not hold."""
        if self.limits.disk is not None:
            self._notes.append(
                "disk: the total written is not capped for a run forked from a session (it shares the "
                f"session's task directory); file_size caps each file at {format_size(self.limits.file_size)}"
            )
        if self.limits.resident is not None:
            self._notes.append("resident: not applied to a run forked from a session (it shares the session's cgroups)")

    def _setup_resident_limit(self, spec: dict[str, Any]) -> None:
        """Put the run in a memory cgroup capped at its memory bound (:meth:`Limits.memory_bound`), where one is
        writable: it counts tmpfs, memfds and shared mappings, which RLIMIT_AS does not.  Without one, a note
        says so when the run asked for ``resident`` (`cellbox doctor` says it for every run)."""
        self._memory_cgroup = None
        bound = self.limits.memory_bound()
        root = memory_cgroup_root()
        if root is None:
            if self.limits.resident is not None:
                self._notes.append(
                    "resident: not applied (no writable memory cgroup here: /sys/fs/cgroup/memory or a cgroup v2 "
                    "root with the memory controller, usually root's only); memory caps each process's address space"
                )
            return
        try:
            self._memory_cgroup = MemoryCgroup(root, bound)
        except OSError as exc:
            if self.limits.resident is not None:
                self._notes.append(f"resident: not applied (memory cgroup unavailable: {exc.strerror or exc})")
            return
        spec["cgroups"] = [*spec.get("cgroups", []), str(self._memory_cgroup.path)]
        self._isolation.append("memory-cgroup")

    def _setup_processes_limit(self, spec: dict[str, Any]) -> None:
        self._cgroup = None
        root = pids_cgroup_root()
        if root is not None:
            try:
                self._cgroup = PidsCgroup(root, self.limits.processes)
                spec["cgroup"] = str(self._cgroup.path)
                self._isolation.append("pids-cgroup")
                return
            except OSError as exc:
                self._notes.append(f"processes: pids cgroup unavailable ({exc.strerror}); using RLIMIT_NPROC")
        spec["nproc_extra"] = self.limits.processes


def writable_by(path: str, uid: int, groups: Sequence[int]) -> bool:
    """Whether ``uid`` (with ``groups``) may create files in the directory ``path``, by its mode bits."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if info.st_uid == uid:
        return bool(info.st_mode & 0o300 == 0o300)
    if info.st_gid in groups:
        return bool(info.st_mode & 0o030 == 0o030)
    return bool(info.st_mode & 0o003 == 0o003)
