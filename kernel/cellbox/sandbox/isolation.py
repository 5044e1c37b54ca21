"""Isolation beyond rlimits: network, process and filesystem namespaces through bubblewrap.

Rlimits and an allowlisted environment contain accidents; they do not stop a
child from reading any file its user can read, opening a network connection,
or signalling the kernel.  This module closes that gap where the machine
allows it.  The launcher runs inside ``bwrap`` (bubblewrap, Debian package
``bubblewrap``, see bwrap(1)), so the supervisor and the command share the
first four layers; the kernel's Landlock LSM gives a fifth:

============  ==================================================================
layer         what it does
============  ==================================================================
``net``       a new network namespace (``--unshare-net``): only a private
              loopback; the host's 127.0.0.1 services are out of reach
``pid``       a new PID namespace with its own ``/proc`` (``--unshare-pid``,
              ``--proc``): the child sees only its own processes, and when the
              namespace's init ends the kernel kills every process left in it
              (pid_namespaces(7)), so ``setsid`` cannot escape
``fs``        a mount namespace whose ``/`` holds read-only binds of the system
              (``/usr``, ``/etc``, ``/lib``...) and of the Python in use (prefixes,
              site directories, the cellbox package), the working directory and
              the task directory read-write at their own paths, a fresh ``/tmp``,
              ``/dev`` and ``/dev/shm``; home directories (``~/.ssh``, the Jupyter
              runtime directory with kernel connection files) and ``/root`` are
              not there
``user``      no powers over the host: an unprivileged user namespace
              (``--unshare-user``, user_namespaces(7)); when cellbox runs as root,
              the command runs as an unprivileged user (``nobody`` unless one is
              given) and the supervisor keeps only CAP_KILL, CAP_SETUID and
              CAP_SETGID (capabilities(7)); ``no_new_privs`` is always set by bwrap
``landlock``  applied by the launcher just before exec, without bubblewrap
              (landlock(7)): the command may read and run only the system, this
              Python and its own program, and write only its working and task
              directories (and the view's ``/tmp`` and ``/dev/shm``; never the
              host's), whatever its user's powers, and never make a device node; TCP is
              refused when the network is off and no ``net`` layer is active;
              signals and abstract unix sockets are scoped to the run (ABI 6)
``ipc``       a new System V IPC namespace (``--unshare-ipc``), with any bwrap layer
============  ==================================================================

A layer the machine cannot give is reported (design rule 8): the run's
``Outcome.notes`` says which and why, and ``cellbox doctor`` prints the same
facts for the machine.  With :attr:`Isolation.mode` ``strict`` a missing layer
stops the run before it starts.

Who calls this: :func:`cellbox.sandbox.start` (``isolation=``), the front doors
through :meth:`Isolation.from_options` (and ``cellbox run`` through
:func:`add_isolation_options`), and ``cellbox doctor`` (:mod:`cellbox.doctor`).
Standard library only; nothing here imports Jupyter.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import errno
import functools
import os
import platform
import pwd
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Isolation",
    "IsolationError",
    "Support",
    "Plan",
    "LAYERS",
    "MODES",
    "UNPRIVILEGED_USER",
    "probe",
    "make_plan",
    "describe",
    "bwrap_prefix",
    "add_isolation_options",
    "isolation_from_args",
]

# Layers a run may ask for, in the order they are reported.
LAYERS = ("net", "pid", "fs", "user", "landlock")
# The layers bubblewrap gives; Landlock is applied by the launcher itself.
BWRAP_LAYERS = ("net", "pid", "fs", "user")
# none: no layer (rlimits and the environment allowlist only); auto: every layer
# this machine supports, the others reported; strict: every layer, or no run.
MODES = ("none", "auto", "strict")
# landlock_create_ruleset(2): the same number on every architecture.
LANDLOCK_CREATE_RULESET = 444
# Where Debian's bubblewrap package puts bwrap, tried when it is not on PATH.
BWRAP_FALLBACK = "/usr/bin/bwrap"
# The user children run as when cellbox itself runs as root and no user is given.
UNPRIVILEGED_USER = "nobody"
# Capabilities the supervisor keeps when it runs as root: kill the command's
# processes (another uid), and switch the command to the unprivileged user.
SUPERVISOR_CAPS = ("CAP_KILL", "CAP_SETUID", "CAP_SETGID")
# System directories bound read-only into the view (symlinks are recreated).
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Read by BLAS libraries and os.cpu_count() for the number of CPUs.
SYSTEM_INFO_PATHS = ("/sys/devices/system/cpu",)
# Secrets inside a home directory, covered when the view would otherwise show them
# (the working directory is a home directory, or one above it).
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".docker",
    ".kube",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    ".config",
    ".jupyter",
    ".local/share/jupyter",
    ".ipython",
    # What the user's own programs run, outside every sandbox: the user site-packages (.pth files run at
    # every start of a Python without a venv), ~/.local/bin (first on many a PATH), shell start-up files
    # and git's config (core.fsmonitor, aliases).  Cells have a home of their own and need none of them.
    ".local/lib",
    ".local/bin",
    ".bashrc",
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".zshrc",
    ".zprofile",
    ".gitconfig",
)
_TRUE = ("1", "true", "yes", "on", "allow", "allowed")
_FALSE = ("0", "false", "no", "off", "deny", "denied", "none")


class IsolationError(ValueError):
    """An isolation setting that cannot be used; ``source`` names where it came from."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Which isolation layers a run asks for, and what its filesystem view holds.

    Attributes:
        mode: ``none`` (no layer), ``auto`` (every layer this machine supports,
            the missing ones reported in the run's notes) or ``strict`` (every
            layer, or the run does not start).
        network: ``True`` lets the child use the network (no ``net`` layer),
            for example a lesson that installs a package.
        layers: the layers to use, a subset of :data:`LAYERS` (default: all).
        read_only: more paths bound read-only into the view at their own paths
            (a grading harness, data files).
        writable: more paths bound read-write.
        hidden: paths covered by an empty directory (or an empty file) even when
            a bound path would show them, for example a kernel's connection file.
        keep_root: when cellbox runs as root, the ``user`` layer keeps the
            program's uid 0, inside a new user namespace with no capabilities
            (capabilities(7)), instead of switching to an unprivileged user: it
            writes a root-owned working directory (a notebook's, in a container)
            as its owner, and has no other power of root's; files of the system
            that only root may read are covered in the view.  The kernel's choice.

    Raises:
        IsolationError: an unknown mode, or a relative path.
    """

    mode: str = "none"
    network: bool = False
    layers: tuple[str, ...] = LAYERS
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    keep_root: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise IsolationError(f"unknown isolation mode {self.mode!r}; use one of {', '.join(MODES)}")
        unknown = [layer for layer in self.layers if layer not in LAYERS]
        if unknown:
            raise IsolationError(f"unknown isolation layer {unknown[0]!r}; use some of {', '.join(LAYERS)}")
        object.__setattr__(self, "layers", tuple(layer for layer in LAYERS if layer in self.layers))
        for name in ("read_only", "writable", "hidden"):
            paths = tuple(str(p) for p in getattr(self, name))
            for path in paths:
                if not os.path.isabs(path):
                    raise IsolationError(f"{name} path {path!r} is not absolute; give a full path")
            object.__setattr__(self, name, tuple(os.path.normpath(p) for p in paths))

    @classmethod
    def from_options(
        cls,
        mode: str = "auto",
        network: bool | str = False,
        layers: str | Iterable[str] = LAYERS,
        read_only: str | Iterable[str] = (),
        writable: str | Iterable[str] = (),
        hidden: str | Iterable[str] = (),
        keep_root: bool | str = False,
        *,
        source: str | None = None,
    ) -> Isolation:
        """Build an :class:`Isolation` from user text (a traitlet, a flag, a config file).

        Args:
            mode: ``none``, ``auto`` or ``strict`` (case and spaces ignored).
            network: a bool, or ``on``/``off``, ``yes``/``no``, ``true``/``false``,
                ``allow``/``deny``, ``1``/``0``.
            layers: some of ``net``, ``pid``, ``fs``, ``user``, as a list or one
                string separated by commas (default: all).
            read_only, writable, hidden: absolute paths, as a list or one string
                separated by ``os.pathsep`` (``:``).
            keep_root: a bool or on/off text, as ``network`` (see :attr:`Isolation.keep_root`).
            source: where the values came from, for the error message
                (``"CellboxKernel.isolation"``, ``"--isolation"``).

        Raises:
            IsolationError: a value that cannot be used, named with ``source``.
        """
        text = str(mode).strip().lower()
        if text not in MODES:
            raise IsolationError(f"unknown isolation mode {mode!r}; use one of {', '.join(MODES)}", source=source)
        try:
            return cls(
                mode=text,
                network=_parse_bool(network, source=source),
                layers=tuple(_parse_names(layers)),
                read_only=_parse_paths(read_only),
                writable=_parse_paths(writable),
                hidden=_parse_paths(hidden),
                keep_root=_parse_bool(keep_root, source=source, what="keep_root"),
            )
        except IsolationError as exc:
            if exc.source or source is None:
                raise
            raise IsolationError(str(exc), source=source) from None

    @classmethod
    def auto(cls, **changes: object) -> Isolation:
        """Every layer this machine supports (``mode="auto"``), with ``changes`` applied."""
        return dataclasses.replace(cls(mode="auto"), **changes)  # type: ignore[arg-type]

    @property
    def wanted(self) -> tuple[str, ...]:
        """The layers this setting asks for, in :data:`LAYERS` order."""
        if self.mode == "none":
            return ()
        return tuple(layer for layer in self.layers if not (layer == "net" and self.network))

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict of the settings."""
        return {**dataclasses.asdict(self), "wanted": list(self.wanted)}


def _parse_bool(value: bool | str, *, source: str | None, what: str = "the network") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise IsolationError(f"expected on or off for {what}, got {value!r}", source=source)


def _parse_names(value: str | Iterable[str]) -> list[str]:
    items = value.replace(" ", ",").split(",") if isinstance(value, str) else [str(v) for v in value]
    return [item.strip().lower() for item in items if item.strip()]


def _parse_paths(value: str | Iterable[str]) -> tuple[str, ...]:
    items = value.split(os.pathsep) if isinstance(value, str) else [str(v) for v in value]
    return tuple(os.path.expanduser(item.strip()) for item in items if item.strip())


# --------------------------------------------------------------------------- what the machine supports


@dataclasses.dataclass(frozen=True)
class Support:
    """What this machine supports, found by trying each layer (bwrap once per layer, a child for the filter).

    Attributes:
        bwrap: the path of bwrap, or ``None`` when it is not installed.
        as_root: ``True`` when this process runs as root (bwrap then needs no
            user namespace, and the ``user`` layer switches to an unprivileged user).
        missing: for each layer that cannot be used, one sentence saying why.
        tmpfs_size: bwrap understands ``--size`` (0.7 and later), so ``/tmp``
            and ``/dev/shm`` in the view are capped.
        disable_userns: bwrap understands ``--disable-userns`` (0.8 and later).
        userns: why no new user namespace can be made here (bwrap's
            ``--unshare-user`` tried), or ``None`` when one can.  As root the
            bwrap layers still work without one; a run kept at uid 0
            (``keep_root``) then has its capabilities dropped in the host's.
        filter: why this machine refuses to load a seccomp filter (tried in a
            child process), or ``None`` when it loads one.
        advice: the one thing to do here to get the missing layers (a sysctl,
            an AppArmor setting, a container's seccomp profile), or ``None``.
    """

    bwrap: str | None
    as_root: bool
    missing: dict[str, str]
    tmpfs_size: bool = False
    disable_userns: bool = False
    userns: str | None = None
    filter: str | None = None
    advice: str | None = None

    def available(self, layer: str) -> bool:
        """``True`` when ``layer`` (one of :data:`LAYERS`) can be used here.

        As root, ``user`` needs no bwrap: where bwrap is missing or cannot
        start, it is a plain switch to an unprivileged user (no capabilities,
        ``no_new_privs``), without a namespace.
        """
        if layer == "user" and self.as_root:
            return "user" not in self.missing
        return layer not in self.missing and (self.bwrap is not None or layer not in BWRAP_LAYERS)

    @property
    def bwrap_usable(self) -> bool:
        """``True`` when bwrap starts here at all (some layer of :data:`BWRAP_LAYERS` works through it)."""
        return self.bwrap is not None and any(
            self.available(layer) for layer in BWRAP_LAYERS if layer != "user" or not self.as_root
        )


def probe(bwrap: str | None = None) -> Support:
    """Find out which layers this machine supports (cached per bwrap path and user).

    Args:
        bwrap: the bwrap program to try (default: ``bwrap`` on ``PATH``, else :data:`BWRAP_FALLBACK`).

    Returns:
        A :class:`Support`; never raises for a missing tool or a refused namespace.
    """
    if bwrap is None:
        bwrap = shutil.which("bwrap") or (BWRAP_FALLBACK if os.access(BWRAP_FALLBACK, os.X_OK) else None)
    return _probe(bwrap, os.geteuid())


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str | None, euid: int) -> Support:
    """The trials behind :func:`probe`, once per process for each bwrap and user (a few bwrap starts, 10-50 ms)."""
    as_root = euid == 0
    landlock = _landlock_missing()
    missing: dict[str, str] = {"landlock": landlock} if landlock else {}
    refused = _filter_missing()
    if bwrap is None:
        why = "bubblewrap is not installed (apt-get install bubblewrap)"
        missing.update({layer: why for layer in BWRAP_LAYERS if layer != "user" or not as_root})
        if as_root and _user_missing():
            missing["user"] = _user_missing() or why
        unknown = "not tried: bubblewrap, which makes them, is not installed"
        return Support(None, as_root, missing, userns=unknown, filter=refused, advice=_advice(None, missing, refused))
    userns_problem = _try(bwrap, ["--unshare-user", "--ro-bind", "/", "/"])
    userns = None if userns_problem is None else _userns_words(userns_problem)
    if userns_problem is not None and not _namespace_refused(userns_problem):
        userns = f"bwrap cannot start here ({userns_problem})"
    base = [] if as_root else ["--unshare-user"]
    problem = _try(bwrap, [*base, "--ro-bind", "/", "/"]) if as_root else userns_problem
    if problem is not None:
        reason = userns if userns is not None and not as_root else f"bwrap cannot start here ({problem})"
        if as_root and userns is None:
            reason += "; bwrap as root needs CAP_SYS_ADMIN here, run cellbox as a normal user instead"
        missing = {**{layer: reason for layer in BWRAP_LAYERS if layer != "user" or not as_root}, **missing}
        if as_root and _user_missing():
            missing["user"] = _user_missing() or reason
        advice = _advice(userns, missing, refused, as_root)
        return Support(bwrap, as_root, missing, userns=userns, filter=refused, advice=advice)
    trials = {
        "net": ["--unshare-net"],
        "pid": ["--unshare-pid", "--as-pid-1", "--proc", "/proc"],
        "fs": ["--dev", "/dev", "--tmpfs", "/tmp"],
    }
    for layer, extra in trials.items():
        problem = _try(bwrap, [*base, "--ro-bind", "/", "/", *extra])
        if problem is not None:
            missing[layer] = f"bwrap {extra[0]} failed ({problem})"
    if as_root and _user_missing():
        missing["user"] = _user_missing() or ""
    sized = _try(bwrap, [*base, "--ro-bind", "/", "/", "--size", "1048576", "--tmpfs", "/tmp"]) is None
    # As root too: the keep_root runs get a user namespace of their own, where nested ones must be refused.
    no_userns = userns is None and _try(bwrap, ["--unshare-user", "--disable-userns", "--ro-bind", "/", "/"]) is None
    advice = _advice(userns, missing, refused, as_root)
    return Support(bwrap, as_root, missing, sized, no_userns, userns=userns, filter=refused, advice=advice)


def _userns_words(problem: str) -> str:
    """Why a new user namespace was refused, in words a user can act on, from bwrap's complaint."""
    if "ENOSPC" in problem or "nesting depth" in problem:
        cause = "the number of user namespaces is capped here"
        if _in_user_namespace():
            cause = "cellbox runs in a container or sandbox that allows no user namespace inside it"
    elif _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        cause = "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10 and later)"
    elif _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        cause = "unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0)"
    elif _read("/proc/sys/user/max_user_namespaces") == "0":
        cause = "user namespaces are disabled (sysctl user.max_user_namespaces=0)"
    elif _in_user_namespace() or os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        cause = "cellbox runs in a container whose seccomp profile refuses new namespaces (Docker's default does)"
    else:
        cause = "new user namespaces are refused here"
    return f"{cause}: no user namespace, so no bubblewrap layer ({problem})"


def _namespace_refused(problem: str) -> bool:
    """``True`` when bwrap's complaint is about the user namespace it was refused, not bwrap itself."""
    return any(word in problem for word in ("namespace", "uid map", "uid_map", "setting up uid", "ENOSPC", "EPERM"))


def _in_user_namespace() -> bool:
    """``True`` when this process is in a user namespace other than the host's (user_namespaces(7): uid_map)."""
    text = _read("/proc/self/uid_map")
    return text is not None and text.split() != ["0", "0", "4294967295"]


def _advice(userns: str | None, missing: dict[str, str], refused: str | None, as_root: bool = False) -> str | None:
    """The one thing to do on this machine to get the layers it lacks, or ``None`` when nothing would help."""
    if as_root and any(why.startswith("bwrap cannot start here") for why in missing.values()):
        return (
            "bubblewrap as root needs CAP_SYS_ADMIN: start the container with --cap-add SYS_ADMIN "
            "--security-opt seccomp=unconfined, or run cellbox there as a normal user with user namespaces allowed"
        )
    if userns is not None and any(layer in missing for layer in BWRAP_LAYERS):
        if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
            return (
                "allow user namespaces: sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0 "
                "(or give /usr/bin/bwrap an AppArmor profile with 'userns,')"
            )
        if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            return "allow user namespaces: sudo sysctl kernel.unprivileged_userns_clone=1"
        if _read("/proc/sys/user/max_user_namespaces") == "0":
            return "allow user namespaces: sudo sysctl user.max_user_namespaces=15000"
        return (
            "start the container with user namespaces allowed: docker run --security-opt seccomp=unconfined "
            "(or a seccomp profile that allows clone and unshare); on Kubernetes, the pod's "
            "securityContext.seccompProfile type Unconfined"
        )
    if any(why.startswith("bubblewrap is not installed") for why in missing.values()):
        return "install bubblewrap (sudo apt-get install bubblewrap)"
    if refused is not None or "landlock" in missing:
        return (
            "run cellbox where the kernel's Landlock and seccomp are allowed (Linux 5.13 or later; a container "
            "started with its runtime's default seccomp profile, not one that refuses them)"
        )
    return None


# prctl(2) options and the one-instruction BPF program SECCOMP_RET_ALLOW (linux/seccomp.h, linux/filter.h).
_FILTER_TRIAL = """
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
code = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000), 8)
prog = Prog(1, ctypes.addressof(code))
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
    sys.exit(ctypes.get_errno() or 1)
"""


def _filter_missing() -> str | None:
    """Why a seccomp filter cannot be loaded here (one is loaded in a child that then exits), or ``None``.

    Tried the way the launcher loads a run's filter: ``no_new_privs``, then
    ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)`` (seccomp(2)).
    """
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _FILTER_TRIAL], capture_output=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the trial could not run ({exc})"
    if done.returncode == 0:
        return None
    name = errno.errorcode.get(done.returncode, f"exit status {done.returncode}")
    return f"this machine refuses to load a seccomp filter ({name}; a container's seccomp profile may forbid it)"


def _user_missing() -> str | None:
    """Why root cannot switch children to :data:`UNPRIVILEGED_USER`, or ``None`` when it can."""
    try:
        pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        return f"there is no user {UNPRIVILEGED_USER!r} to run children as; create it or pass user="
    return None


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (landlock_create_ruleset(2) with the VERSION flag), or 0."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        version = int(libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), 1))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _landlock_missing() -> str | None:
    """Why Landlock cannot be had here (landlock_create_ruleset(2) tried), or ``None`` when it can."""
    if landlock_abi() >= 1:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), 1)
        code = ctypes.get_errno()
    except (OSError, AttributeError):
        code = 0
    if code == errno.EOPNOTSUPP:
        return "the kernel has Landlock but it is off (add landlock to the lsm= boot parameter)"
    if code == errno.ENOSYS and _kernel_at_least(5, 13):
        return (
            "landlock_create_ruleset(2) fails with ENOSYS on Linux 5.13 or later: this kernel was built without "
            "Landlock, or a container's seccomp profile refuses it"
        )
    return "the kernel has no Landlock (Linux 5.13 or later, with landlock in the lsm= boot parameter)"


def _kernel_at_least(major: int, minor: int) -> bool:
    """``True`` when this Linux release (uname(2)) is ``major.minor`` or later."""
    try:
        found = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


def _try(bwrap: str, args: list[str]) -> str | None:
    """Run ``bwrap ARGS -- true``; ``None`` when it worked, else bwrap's first line of complaint."""
    true = shutil.which("true") or "/bin/true"
    try:
        done = subprocess.run(
            [bwrap, *args, "--", true], capture_output=True, timeout=10, stdin=subprocess.DEVNULL, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[0] if lines else f"exit status {done.returncode}"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# --------------------------------------------------------------------------- one run's plan


@dataclasses.dataclass
class Plan:
    """Which layers one run gets, and what its report says about the others.

    Attributes:
        layers: the layers that will be active, in :data:`LAYERS` order (plus ``ipc``).
        missing: for each wanted layer that cannot be used, why.
        user: the user the command must run as (root plus the ``user`` layer), or ``None``.
        notes: sentences for the run's ``Outcome.notes``.
        sockets: ``(inet, unix)``, the socket families the syscall filter refuses
            (``syscall-filter`` in ``layers`` when the filter is given).
        refuse: the other groups of calls it refuses (keys of :data:`REFUSALS`).
    """

    layers: list[str]
    missing: dict[str, str]
    user: str | int | None
    notes: list[str] = dataclasses.field(default_factory=list)
    sockets: tuple[bool, bool] = (False, False)
    refuse: tuple[str, ...] = ()


def make_plan(isolation: Isolation, support: Support, *, user: str | int | None) -> Plan:
    """Decide which layers a run gets, before anything is started.

    Args:
        isolation: what the run asks for.
        support: what the machine gives (:func:`probe`).
        user: the ``user=`` the caller gave :func:`cellbox.sandbox.start`, if any.

    Returns:
        A :class:`Plan`; :func:`bwrap_prefix` turns it into bwrap's arguments.
    """
    layers = [layer for layer in isolation.wanted if support.available(layer)]
    missing = {layer: support.missing.get(layer, "bwrap is missing") for layer in isolation.wanted}
    missing = {layer: why for layer, why in missing.items() if layer not in layers}
    run_as = user
    if "user" in layers and support.as_root and user is None and not isolation.keep_root:
        run_as = UNPRIVILEGED_USER
    unscoped = not support.bwrap_usable and landlock_abi() < 6
    if "user" in layers and support.as_root and user is None and isolation.keep_root and unscoped:
        # uid 0 without capabilities may still signal every process of root's: only Landlock's signal
        # scope (or bubblewrap's pid namespace) keeps it in, so without both the run takes another user.
        run_as = UNPRIVILEGED_USER
    bwrapped = [layer for layer in layers if layer in BWRAP_LAYERS] if support.bwrap_usable else []
    if bwrapped and not support.as_root and "user" not in layers:
        layers = [layer for layer in LAYERS if layer in layers or layer == "user"]  # bwrap needs it
    if bwrapped:
        layers.append("ipc")
    notes = _missing_notes(missing)
    if isolation.keep_root and run_as == UNPRIVILEGED_USER and user is None:
        notes.append(
            f"user: runs as {UNPRIVILEGED_USER}, not uid 0 without capabilities: without bubblewrap and Landlock's "
            "signal scope (ABI 6, Linux 6.12) uid 0 could still signal root's processes"
        )
    sockets = _sockets_to_deny(isolation, layers)
    kept_root = support.as_root and isolation.keep_root and "user" in layers and run_as is None and not bwrapped
    # bwrap refuses nested user namespaces (--disable-userns) only where it makes the run's own: as a normal
    # user, and for root kept at uid 0; a run root hands to another user gets the filter's refusal instead.
    own_userns = support.disable_userns and (not support.as_root or (isolation.keep_root and run_as is None))
    refuse = _calls_to_refuse(
        isolation,
        layers,
        bwrapped=bool(bwrapped),
        kept_root=kept_root,
        userns_open=bool(bwrapped) and not own_userns,
        as_root=support.as_root,
    )
    if any(sockets) or refuse:
        blocked = support.filter or socket_filter_missing()
        if blocked is None:
            layers.append("syscall-filter")
        elif any(sockets):
            reach = " and ".join(w for w, deny in zip(("UDP", "unix sockets"), sockets, strict=True) if deny)
            notes.append(f"net: {reach} still reach the host (Landlock refuses TCP only; no syscall filter: {blocked})")
        if blocked is not None and refuse:
            notes.append(f"syscall filter: not applied ({blocked}): {', '.join(REFUSAL_WORDS[g] for g in refuse)}")
        elif "file-attributes" in refuse:
            notes.append(
                "user: as root without bubblewrap the program may not change modes, owners, ACLs or times of files"
            )
    if support.as_root and "user" in layers and "fs" not in layers and run_as is not None:
        notes.append(
            f"user: without the fs layer, {run_as} must reach the interpreter and the working directory by itself"
        )
    return Plan(layers=layers, missing=missing, user=run_as, notes=notes, sockets=sockets, refuse=refuse)


def _missing_notes(missing: dict[str, str]) -> list[str]:
    """One note per reason: ``"net, pid: isolation layers not active: WHY"`` (the layers that share it, in order)."""
    by_reason: dict[str, list[str]] = {}
    for layer, why in missing.items():
        by_reason.setdefault(why, []).append(layer)
    return [
        f"{', '.join(layers)}: isolation layer{'s' if len(layers) > 1 else ''} not active: {why}"
        for why, layers in by_reason.items()
    ]


# What a run may do when the filter of a group is missing, for its note.
REFUSAL_WORDS = {
    "ipc": "System V IPC, POSIX message queues and kernel keys outlive the run",
    "file-attributes": "root's files may change mode, owner, ACLs and times",
    "userns": "a user namespace gives the program capabilities of its own",
    "process-control": "a process of the run may trace another (ptrace) and read or write its memory",
    "setid-files": "set-user-ID and set-group-ID files may be made",
    "file-capabilities": "root's program may give a file capabilities (setxattr security.capability)",
}


def _calls_to_refuse(
    isolation: Isolation,
    layers: list[str],
    *,
    bwrapped: bool,
    kept_root: bool,
    userns_open: bool = False,
    as_root: bool = False,
) -> tuple[str, ...]:
    """The groups of :data:`REFUSALS` a run's filter needs: one for each wall bubblewrap would have given.

    ``ipc`` and ``userns`` whenever bubblewrap is not in front of the run (no
    IPC namespace, no ``--disable-userns``); ``file-attributes`` when root is
    kept at uid 0 without bubblewrap's user namespace (``kept_root``); with
    bubblewrap, ``userns`` alone when it leaves nested user namespaces open
    (``userns_open``: root's run handed to another user, or a bwrap before 0.8).
    And always the walls no namespace gives (:func:`walls_refused`).
    """
    if not isolation.wanted:
        return ()
    if bwrapped:
        return (*(("userns",) if userns_open else ()), *walls_refused(as_root))
    return ("ipc", *(("file-attributes",) if kept_root else ()), "userns", *walls_refused(as_root))


def walls_refused(as_root: bool) -> tuple[str, ...]:
    """The groups of :data:`REFUSALS` every run's filter holds, in every isolation mode (``none`` too).

    No namespace gives these walls: ``process-control`` (one process of a run
    or a session tracing, reading or writing another: a cell resuming a stopped
    snapshot with PTRACE_CONT), ``setid-files`` (no run makes a set-user-ID or
    set-group-ID file, which another user would run with the run's uid), and
    for root's runs (``as_root``) ``file-capabilities``, the same escalation
    through an extended attribute (capabilities(7), "File capabilities").
    """
    return ("process-control", "setid-files", *(("file-capabilities",) if as_root else ()))


def _sockets_to_deny(isolation: Isolation, layers: list[str]) -> tuple[bool, bool]:
    """``(inet, unix)``: the socket families the run's syscall filter must refuse (see :func:`socket_filter`).

    Internet sockets, when the network is off and no net layer gives a private
    one.  Unix sockets, when no fs layer hides the host's listeners (``/run``,
    ``/tmp``...), or when abstract ones reach the host: no net layer, and no
    Landlock scope for them (ABI 6).
    """
    if not isolation.wanted:
        return (False, False)
    inet = not isolation.network and "net" not in layers
    abstract_scoped = "landlock" in layers and landlock_abi() >= 6
    unix = "fs" not in layers or ("net" not in layers and not abstract_scoped)
    return (inet, unix)


# socket(2) families a run without the net layer may not open: everything but AF_NETLINK (16, the
# kernel's own), and AF_INET/AF_INET6 (2, 10) too when the network is off.  socketpair(2) of
# SOCK_STREAM stays allowed: its two ends are connected to each other, and reach nothing outside
# the run (asyncio, multiprocessing.Pipe, the session).
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
# socketpair(2) types refused with unix sockets (the type argument masked with 0xf, which drops
# SOCK_NONBLOCK and SOCK_CLOEXEC): an end of a datagram pair is not bound to its peer, so sendto(2)
# or connect(2) with an address reaches any pathname socket of the host (/dev/log, journald's).
SOCK_TYPE_MASK = 0xF
SOCK_DGRAM, SOCK_RAW, SOCK_RDM, SOCK_SEQPACKET, SOCK_DCCP, SOCK_PACKET = 2, 3, 4, 5, 6, 10
# The groups of calls the filter may refuse besides sockets (Plan.refuse), each for one wall a run lacks.
REFUSALS = {
    # No IPC namespace (bubblewrap's --unshare-ipc): System V objects, POSIX message queues and
    # kernel keys would outlive the run, shared with the host's processes of the same uid.
    "ipc": ("shmget", "msgget", "semget", "mq_open", "add_key", "request_key", "keyctl"),
    # Root kept at uid 0 without bubblewrap's user namespace owns every root file; Landlock has no
    # right for modes, owners, extended attributes (ACLs, file capabilities) or times.
    "file-attributes": (
        *("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "fchownat", "lchown"),
        *("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr"),
        *("utime", "utimes", "utimensat", "futimesat"),
    ),
    # No bubblewrap --disable-userns: unshare(2)/clone(2) with CLONE_NEWUSER would give the program a
    # full capability set in a namespace of its own (rules in _refuse_user_namespaces).
    "userns": (),
    # Every process of a session shares its user and Landlock domain: without these a cell could trace a
    # stopped snapshot and resume it (PTRACE_CONT sends no SIGCONT), or take another process's fds.
    "process-control": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise"),
    # A set-user-ID or set-group-ID file left in a writable folder runs as the run's user for anyone
    # (rules on the mode argument in _refuse_setid_files).
    "setid-files": (),
    # A file capability (security.capability) is the same escalation as a set-user-ID bit: root's runs
    # set no extended attribute at all, since seccomp cannot read the attribute's name.
    "file-capabilities": ("setxattr", "lsetxattr", "fsetxattr"),
}
# The set-user-ID and set-group-ID bits of a mode (inode(7)), and where each call takes its mode
# (libseccomp numbers the raw syscall arguments from 0).  mkdir(2) and mkdirat(2) are not here: Linux
# drops both bits from their mode (a directory only inherits S_ISGID from its parent), so refusing them
# would only break a program that asks for 02775.
S_ISUID, S_ISGID = 0o4000, 0o2000
SETID_MODE_ARGUMENTS = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
}
CLONE_NEWUSER = 0x10000000
# Families above AF_NETLINK are refused with one "greater or equal" rule.
AF_FIRST_ABOVE_NETLINK = 17
# mknod(2) and mknodat(2) of a character or block device (S_IFCHR, S_IFBLK under S_IFMT).
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000


@functools.lru_cache(maxsize=8)
def socket_filter(inet: bool = True, unix: bool = True, refuse: tuple[str, ...] = (), basic: bool = True) -> bytes:
    """The seccomp filter of a run that lacks a wall (net, fs, ipc or user), as a BPF program (bytes).

    Built with libseccomp (the ``pyseccomp`` bindings, over Debian's
    ``libseccomp2``), loaded by the launcher just before exec
    (seccomp(2), ``SECCOMP_MODE_FILTER``).  It refuses with EPERM:

    - ``socket(2)`` of every family but AF_NETLINK, AF_UNIX and AF_INET/AF_INET6;
      AF_UNIX too when ``unix`` (no pathname socket in the host's ``/run``,
      ``/tmp``, ``/dev/shm`` and no abstract one is reached), AF_INET and
      AF_INET6 too when ``inet`` (no UDP datagram leaves: the network is off);
    - ``mknod(2)``/``mknodat(2)`` of a device node;
    - io_uring (``io_uring_setup(2)`` and the rest), whose operations, sockets
      included, never pass through seccomp;
    - with ``unix``, ``socketpair(2)`` of every type but SOCK_STREAM (see
      :data:`SOCK_DGRAM`...), and with ``inet`` as well ``connect(2)``: no
      socket is then left that it could aim (a stream pair is connected, and
      sendto(2)/sendmsg(2) with an address on it fail with EISCONN);
    - each group named in ``refuse`` (keys of :data:`REFUSALS`): ``ipc``
      (System V IPC, POSIX message queues, kernel keys), ``file-attributes``
      (chmod, chown, extended attributes and times of files) and ``userns``
      (``unshare(2)`` and ``clone(2)`` with CLONE_NEWUSER; ``clone3(2)``, whose
      flags seccomp cannot read, fails with ENOSYS, so glibc falls back to
      ``clone(2)``, as container runtimes do).  A call this libseccomp does not
      know (``fchmodat2`` before 2.5.5) is left out.  Three groups every run
      holds (:func:`walls_refused`): ``process-control`` (ptrace(2),
      process_vm_readv(2)/process_vm_writev(2), pidfd_getfd(2),
      process_madvise(2)), ``setid-files`` (chmod(2) and its kin, open(2),
      openat(2), creat(2), mknod(2) and their ``at`` forms with
      S_ISUID or S_ISGID in the mode, whatever the other bits; ``openat2(2)``,
      whose mode is in a struct seccomp cannot read, fails with ENOSYS, so
      libc falls back to ``openat(2)``) and ``file-capabilities``
      (setxattr(2) and its kin).

    Args:
        inet: refuse AF_INET and AF_INET6 sockets (the network is off).
        unix: refuse AF_UNIX sockets and unconnected socket pairs.
        refuse: names of :data:`REFUSALS`, in any order.
        basic: the socket families and device nodes above; ``False`` for a run
            with isolation ``none``, whose filter holds ``refuse`` and io_uring only.

    Arguments are compared on their low 32 bits, as the kernel reads an
    ``int`` (a family with high bits set is the same family).  A program
    built for another architecture (32-bit ``int 0x80`` calls) is killed.

    Raises:
        OSError: libseccomp or its bindings are missing, or refused the filter
            (:func:`socket_filter_missing` says which, in a sentence).
        ValueError: a name in ``refuse`` that is not in :data:`REFUSALS`.
    """
    unknown = [name for name in refuse if name not in REFUSALS]
    if unknown:
        raise ValueError(f"unknown syscall group {unknown[0]!r}; use some of {', '.join(REFUSALS)}")
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError) as exc:
        raise OSError(f"libseccomp is not available ({exc})") from None
    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    if basic:
        _refuse_socket_families(seccomp, rules, deny, inet=inet, unix=unix)
    # io_uring's operations (an openat with any mode, sockets) never pass through seccomp.
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        rules.add_rule(deny, call)
    if basic and unix:
        # SOCK_SEQPACKET stays allowed, as SOCK_STREAM: its ends are connected to each other, an address
        # given to sendto(2) is ignored (af_unix.c, unix_seqpacket_sendmsg) and connect(2) fails with
        # EISCONN; the session's keeper and its snapshots talk over such pairs.
        for kind in (SOCK_DGRAM, SOCK_RAW, SOCK_RDM, SOCK_DCCP, SOCK_PACKET):
            rules.add_rule(deny, "socketpair", seccomp.Arg(1, seccomp.MASKED_EQ, SOCK_TYPE_MASK, kind))
        if inet:
            rules.add_rule(deny, "connect")
    for group in dict.fromkeys(refuse):
        for call in REFUSALS[group]:
            _refuse_if_known(seccomp, rules, deny, call)
        if group == "userns":
            _refuse_user_namespaces(seccomp, rules, deny)
        if group == "setid-files":
            _refuse_setid_files(seccomp, rules, deny)
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "wb") as out:
            rules.export_bpf(out)
        with os.fdopen(read_end, "rb") as source:
            return source.read()
    except BaseException:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass
        raise


def _refuse_socket_families(seccomp: Any, rules: Any, deny: Any, *, inet: bool, unix: bool) -> None:
    """socket(2) of the families :func:`socket_filter` refuses, and mknod(2)/mknodat(2) of a device node."""
    low = 0xFFFF_FFFF
    allowed = {AF_NETLINK, *(() if inet else (AF_INET, AF_INET6)), *(() if unix else (AF_UNIX,))}
    for family in range(AF_FIRST_ABOVE_NETLINK):
        if family not in allowed and family != 0:
            rules.add_rule(deny, "socket", seccomp.Arg(0, seccomp.MASKED_EQ, low, family))
    # With high bits set a family can only compare greater; the kernel reads the low 32 bits.
    rules.add_rule(deny, "socket", seccomp.Arg(0, seccomp.GE, AF_FIRST_ABOVE_NETLINK))
    for call, mode_arg in (("mknod", 1), ("mknodat", 2)):
        for kind in (S_IFCHR, S_IFBLK):
            rules.add_rule(deny, call, seccomp.Arg(mode_arg, seccomp.MASKED_EQ, S_IFMT, kind))


def _refuse_setid_files(seccomp: Any, rules: Any, deny: Any) -> None:
    """Every call of :data:`SETID_MODE_ARGUMENTS` with S_ISUID or S_ISGID in its mode; openat2(2) with ENOSYS.

    One rule per bit (libseccomp ORs the rules of a call): the mode masked
    with the bit equals the bit, whatever the call's other arguments.  open(2)
    and openat(2) use the mode only when they create (O_CREAT, O_TMPFILE), and
    libc passes 0 otherwise, so a plain open never carries these bits.
    """
    for call, mode_arg in SETID_MODE_ARGUMENTS.items():
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, call) < 0:
            continue  # not a call of this architecture (aarch64 has no open, chmod, mkdir...)
        for bit in (S_ISUID, S_ISGID):
            rules.add_rule(deny, call, seccomp.Arg(mode_arg, seccomp.MASKED_EQ, bit, bit))
    _refuse_if_known(seccomp, rules, seccomp.ERRNO(errno.ENOSYS), "openat2")


def _refuse_if_known(seccomp: Any, rules: Any, action: Any, call: str) -> None:
    """Refuse ``call`` with ``action``; a call this libseccomp has no number for is left out."""
    if seccomp.resolve_syscall(seccomp.Arch.NATIVE, call) >= 0:
        rules.add_rule(action, call)


def _refuse_user_namespaces(seccomp: Any, rules: Any, deny: Any) -> None:
    """unshare(2) and clone(2) with CLONE_NEWUSER refused; clone3(2) fails with ENOSYS.

    clone's flags are its first argument on x86_64 and aarch64 (and its second
    on s390, CLONE_BACKWARDS2); libseccomp numbers the raw syscall arguments.
    """
    flags = 1 if platform.machine().startswith("s390") else 0
    rules.add_rule(deny, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    rules.add_rule(deny, "clone", seccomp.Arg(flags, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    _refuse_if_known(seccomp, rules, seccomp.ERRNO(errno.ENOSYS), "clone3")


def socket_filter_missing() -> str | None:
    """Why this machine cannot give :func:`socket_filter`, or ``None`` when it can."""
    try:
        socket_filter(refuse=tuple(REFUSALS))
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def describe(isolation: Isolation, support: Support | None = None) -> str:
    """One line for a banner or a report: the mode, the layers runs will get, and what is missing and why.

    ``"isolation auto: net, pid, fs, user, landlock"``, or
    ``"isolation auto: landlock (net, pid, fs, user: not available: ...)"``
    (layers that share a reason are named together), or
    ``"isolation none: rlimits and environment allowlist only"``.
    """
    if not isolation.wanted:
        return f"isolation {isolation.mode}: rlimits and environment allowlist only"
    plan = make_plan(isolation, support or probe(), user=None)
    active = [layer for layer in plan.layers if layer in LAYERS]
    line = f"isolation {isolation.mode}: {', '.join(active) or 'no layer'}"
    if isolation.network:
        line += " (network allowed)"
    if plan.missing:
        by_reason: dict[str, list[str]] = {}
        for layer, why in plan.missing.items():
            by_reason.setdefault(why, []).append(layer)
        line += " (" + "; ".join(f"{', '.join(names)}: not available: {why}" for why, names in by_reason.items()) + ")"
    return line


def bwrap_prefix(
    plan: Plan,
    support: Support,
    isolation: Isolation,
    *,
    programs: Sequence[str],
    cwd: str,
    task: str,
    cgroup: str | None,
    tmpfs_bytes: int,
    path: str,
    task_size: int | None = None,
    cgroups: Sequence[str] = (),
) -> list[str]:
    """The ``bwrap ... --`` argv that gives ``plan.layers`` to the launcher.

    Args:
        plan: from :func:`make_plan`; its ``layers`` must not be empty.
        support: from :func:`probe`.
        isolation: the run's settings (extra read-only, writable and hidden paths).
        programs: commands the view must be able to run (the launcher's Python,
            the command's ``argv[0]``); their prefixes and virtualenvs are bound.
        cwd: the working directory, bound read-write.
        task: the task directory, bound read-write (``HOME`` and ``TMPDIR`` are in it).
        cgroup: the run's pids cgroup directory, bound read-write so the command can join it.
        tmpfs_bytes: size of the fresh ``/tmp`` and ``/dev/shm`` (bytes).
        path: the child's ``PATH``, to find ``programs`` that are bare names.
        task_size: with the ``fs`` layer, the task directory is a fresh tmpfs of
            this many bytes (with empty ``home/``, ``work/`` and ``tmp/``) instead of
            the host's directory: the run's ``disk`` limit.  ``None``: bound as it is.
        cgroups: more cgroup directories the command joins (a memory cgroup), bound read-write.
    """
    assert support.bwrap is not None
    args = [support.bwrap, "--unshare-ipc"]
    if "net" in plan.layers:
        args.append("--unshare-net")
    if "pid" in plan.layers:
        # The launcher itself is the namespace's init (no bwrap reaper, which
        # would wait for orphans): when it ends, the kernel kills every process
        # left in the namespace (pid_namespaces(7)), and the command cannot
        # signal it (init gets only the signals it handles).
        args += ["--unshare-pid", "--as-pid-1"]
    if not support.as_root:
        # Without root, bwrap needs a user namespace for every other layer;
        # nested ones are refused, so the child cannot regain powers in its own.
        args.append("--unshare-user")
        if support.disable_userns:
            args.append("--disable-userns")
    elif "user" in plan.layers and isolation.keep_root and support.userns is not None:
        # No user namespace to be had here (a container's): uid 0 of the host's, every capability dropped
        # (bwrap empties the bounding set too); the filter refuses the program a user namespace of its own.
        args += ["--cap-drop", "ALL"]
    elif "user" in plan.layers and isolation.keep_root:
        # uid 0 inside, mapped to root outside, with every capability dropped:
        # the owner of root's files, and no power beyond that (user_namespaces(7)).
        args += ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL"]
        if support.disable_userns:
            args.append("--disable-userns")
    elif "user" in plan.layers:
        args += ["--cap-drop", "ALL"]
        for cap in SUPERVISOR_CAPS:
            args += ["--cap-add", cap]
    if "fs" in plan.layers:
        args += _view(isolation, support, programs, cwd, task, [*filter(None, [cgroup]), *cgroups], tmpfs_bytes, path)
        if task_size is not None:
            args += _task_tmpfs(task, task_size)
    else:
        args += ["--bind", "/", "/", "--dev-bind", "/dev", "/dev"]
    args += ["--proc", "/proc"] if "pid" in plan.layers else ["--ro-bind", "/proc", "/proc"]
    return [*args, "--"]


def landlock_rules(
    isolation: Isolation, plan: Plan, *, programs: Sequence[str], cwd: str, task: str, path: str
) -> dict[str, object]:
    """What the launcher's Landlock ruleset allows (applied in ``_launch.apply_landlock``).

    Reading and running: the system, this Python, the command, ``/proc``, a
    few named devices and the extra read-only paths.  Writing too: the working
    directory, the task directory, the extra writable paths, the harmless
    devices, and the view's own ``/tmp`` and ``/dev/shm`` (with the ``fs`` layer
    only: without it they are the host's, shared with every user).  Every other path (homes
    included) cannot even be read, whatever the user's powers.  TCP is denied
    when the network is off but no ``net`` layer gives a private one, and
    signals and abstract unix sockets are scoped to the run (Landlock ABI 6).
    """
    # Named devices only: beneath /dev lie the disks, which root could read whole.
    devices = ["/dev/random", "/dev/urandom", "/dev/tty"]
    system: list[str] = list(SYSTEM_PATHS)
    if isolation.keep_root and "fs" not in plan.layers:
        # uid 0 without capabilities still owns root's files: allow /etc around those only root may read.
        system = [*(p for p in SYSTEM_PATHS if p != "/etc"), *paths_around("/etc", set(root_only_files()))]
    read = [*system, *SYSTEM_INFO_PATHS, "/proc", *devices, *python_paths(), *program_paths(programs, path)]
    if isolation.network:
        read.append(os.path.dirname(os.path.realpath("/etc/resolv.conf")))
    write = [cwd, task, *isolation.writable, "/dev/null", "/dev/zero", "/dev/full"]
    if "fs" in plan.layers:
        # The run's own tmpfs mounts in the view; without it they are the host's, shared with every user.
        write += ["/tmp", "/dev/shm"]
        # The view's own devpts instance (bwrap --dev): pseudo-terminals for
        # IPython's !cmd, private to the run.  The host's /dev/pts is never opened
        # up, where another terminal of the same user could be written to.
        write += ["/dev/pts", "/dev/ptmx"]
    return {
        "read": list(dict.fromkeys([*read, *_readable(isolation)])),
        "write": list(dict.fromkeys(write)),
        "deny_tcp": not isolation.network and "net" not in plan.layers,
        "scope": True,
        "required": isolation.mode == "strict",
    }


def _readable(isolation: Isolation) -> list[str]:
    """Landlock's read rules for the extra read-only paths, around the secrets and hidden paths inside them.

    Landlock only allows, so a hidden path inside a read-only tree (a connection
    file in a course folder) is kept out by naming the tree's other entries
    (:func:`paths_around`); the ``fs`` layer covers the same paths in the view.
    """
    secrets = set(secret_paths(isolation.hidden))
    found: list[str] = []
    for path in isolation.read_only:
        found += paths_around(path, {s for s in secrets if _within(s, path) and s != path})
    return found


def _task_tmpfs(task: str, size: int) -> list[str]:
    """bwrap arguments that put a tmpfs of ``size`` bytes over the task directory, with its three folders.

    Mounted after the view, so it covers the host's task directory (and a
    working directory inside it).  The folders are open to all: only the run
    sees them, and its user (``nobody`` as root) must write them.
    """
    args = ["--size", str(size), "--perms", "0755", "--tmpfs", task]
    for name in ("home", "work", "tmp"):
        args += ["--perms", "1777", "--dir", os.path.join(task, name)]
    return args


def _view(
    isolation: Isolation,
    support: Support,
    programs: Sequence[str],
    cwd: str,
    task: str,
    cgroups: Sequence[str],
    tmpfs_bytes: int,
    path: str,
) -> list[str]:
    """bwrap arguments for the filesystem view (see the module docstring)."""
    size = ["--size", str(tmpfs_bytes)] if support.tmpfs_size else []
    args = [*size, "--perms", "1777", "--tmpfs", "/tmp"]
    for system in SYSTEM_PATHS:
        if os.path.islink(system):
            args += ["--symlink", os.readlink(system), system]
    entries = _view_entries(isolation, programs, cwd, task, cgroups, path)
    # Parents before children, so a deeper bind lands on top of a shallower one.
    mounted: dict[str, str] = {}
    for target in sorted(entries, key=lambda p: (p.count(os.sep), p)):
        kind = entries[target]
        if kind != "hide" and not os.path.exists(target):
            continue
        args += _parents(target, mounted)
        mounted[target] = kind
        if kind == "ro" or kind == "rw":
            args += ["--ro-bind" if kind == "ro" else "--bind", target, target]
        elif os.path.isdir(target):
            args += [*size, "--tmpfs", target]  # a covered directory is empty
        else:
            # A covered file is /dev/null: it reads as empty and swallows writes
            # (plain binds and --remount-ro add nodev, which makes it unreadable).
            args += ["--dev-bind", "/dev/null", target]
    return [*args, "--dev", "/dev", *size, "--perms", "1777", "--tmpfs", "/dev/shm"]


def _view_entries(
    isolation: Isolation, programs: Sequence[str], cwd: str, task: str, cgroups: Sequence[str], path: str
) -> dict[str, str]:
    """What the view shows: each path mapped to ``ro``, ``rw`` or ``hide``."""
    entries: dict[str, str] = {}
    for source in [*SYSTEM_PATHS, *SYSTEM_INFO_PATHS, *python_paths(), *program_paths(programs, path)]:
        if not os.path.islink(source):
            entries.setdefault(source, "ro")
    if isolation.network:
        # /etc/resolv.conf is often a link into /run (systemd-resolved, resolvconf).
        resolver = os.path.realpath("/etc/resolv.conf")
        if not _within(resolver, "/etc") and os.path.exists(resolver):
            entries.setdefault(os.path.dirname(resolver), "ro")
    entries.update({p: "ro" for p in isolation.read_only})
    # A working directory of / would show the whole host: the view's own / stands in.
    entries.update({p: "rw" for p in (task, cwd, *isolation.writable) if p != "/"})
    for cgroup in cgroups:
        entries[cgroup] = "rw"
    _make_missing_secrets([path for path, kind in entries.items() if kind == "rw"])
    for secret in secret_paths(isolation.hidden):
        if _shown(secret, entries) and not _within(cwd, secret):
            entries[secret] = "hide"
    if isolation.keep_root:
        entries.update({secret: "hide" for secret in root_only_files()})
    return entries


@functools.lru_cache(maxsize=1)
def root_only_files() -> tuple[str, ...]:
    """Files under ``/etc`` that only their owner or group may read (``/etc/shadow``, host keys...).

    A program kept at uid 0 without capabilities still reads what root owns;
    the view covers these so it cannot.
    """
    found = []
    for directory, _dirs, files in os.walk("/etc"):
        for name in files:
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not os.path.islink(path) and not info.st_mode & 0o004:
                found.append(path)
    return tuple(sorted(found))


def paths_around(top: str, excluded: set[str]) -> list[str]:
    """Paths that together cover ``top`` and everything beneath it except ``excluded`` (files).

    Landlock can only allow, so to keep a few files out of a directory its
    rules name the directory's other entries instead, going down only where an
    excluded file lies.  Used for ``/etc`` around :func:`root_only_files`.
    """
    if not any(_within(path, top) for path in excluded):
        return [top]
    found = []
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if entry.path in excluded:
            continue
        if entry.is_dir(follow_symlinks=False):
            found += paths_around(entry.path, excluded)
        else:
            found.append(entry.path)
    return found


def _parents(target: str, mounted: dict[str, str]) -> list[str]:
    """``--dir`` for each parent of ``target`` that no host bind shows, made 0755.

    bwrap makes missing parents 0700 by itself, which an unprivileged user
    cannot cross: an interpreter under ``/root`` would be out of its reach.
    A parent inside a bind exists already; inside the view's own tmpfs (its
    ``/``, ``/tmp``, a covered directory) it must be made.
    """
    args = []
    parts = target.strip(os.sep).split(os.sep)[:-1]
    for depth in range(1, len(parts) + 1):
        parent = os.sep + os.sep.join(parts[:depth])
        enclosing = [m for m in mounted if _within(parent, m)]
        if parent in SYSTEM_PATHS or (enclosing and mounted[max(enclosing, key=len)] != "hide"):
            continue
        args += ["--perms", "0755", "--dir", parent]
    return args


def _within(path: str, ancestor: str) -> bool:
    """``True`` when ``path`` is ``ancestor`` or lies below it."""
    return path == ancestor or path.startswith(ancestor.rstrip(os.sep) + os.sep)


def _shown(path: str, entries: dict[str, str]) -> bool:
    """``True`` when a bound entry would show ``path`` in the view."""
    return any(_within(path, bound) for bound, kind in entries.items() if kind != "hide")


def python_paths() -> list[str]:
    """Directories this Python needs, to bind read-only: prefixes, site directories, .pth entries, cellbox.

    An interpreter under a private home (``/root/.pyenv``) is reachable this way
    without showing the rest of that home.  Found once per process.
    """
    return list(_python_paths())


@functools.cache
def _python_paths() -> tuple[str, ...]:
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    found.append(_prefix_of(os.path.realpath(sys.executable)))
    sites = [*site.getsitepackages(), site.getusersitepackages() if site.ENABLE_USER_SITE else ""]
    for directory in filter(None, sites):
        found.append(directory)
        found += _pth_paths(directory)
    found.append(str(Path(__file__).resolve().parent))
    return tuple(p for p in dict.fromkeys(os.path.normpath(p) for p in found if p) if p != "/" and os.path.isdir(p))


def _pth_paths(directory: str) -> list[str]:
    """Directories that ``.pth`` files in a site directory add to ``sys.path`` (see the site module)."""
    found = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".pth"))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                found.append(os.path.join(directory, line))
    return found


def _prefix_of(program: str) -> str:
    """``/opt/py/bin/python3`` -> ``/opt/py``; a program not in a ``bin`` directory -> its directory."""
    directory = os.path.dirname(program)
    return os.path.dirname(directory) if os.path.basename(directory) == "bin" else directory


def program_paths(programs: Sequence[str], path: str) -> list[str]:
    """Directories that make each program runnable in the view: its virtualenv, and its real prefix.

    ``/work/venv/bin/python`` gives ``/work/venv`` and, through its link,
    ``/root/.pyenv/versions/3.11.7``.  A program in ``~/bin`` gives ``~/bin``
    alone: a home directory is never bound whole.
    """
    found = []
    homes = home_directories()
    for program in programs:
        located = program if os.sep in program else shutil.which(program, path=path)
        if not located:
            continue
        located = os.path.abspath(located)
        if os.path.exists(os.path.join(_prefix_of(located), "pyvenv.cfg")):
            found.append(_prefix_of(located))
        real = os.path.realpath(located)
        prefix = _prefix_of(real)
        found.append(os.path.dirname(real) if prefix in homes else prefix)
    return [p for p in dict.fromkeys(found) if p not in ("/", "") and os.path.isdir(p)]


def home_directories() -> list[str]:
    """Home directories whose contents a child must not see: this user's, ``$HOME``, ``/root``."""
    homes = ["/root", os.path.expanduser("~")]
    try:
        homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    return [p for p in dict.fromkeys(os.path.normpath(h) for h in homes) if p != "/"]


def runtime_directories() -> list[str]:
    """Where Jupyter keeps kernel connection files (jupyter_core's ``jupyter_runtime_dir`` rules)."""
    found = []
    if os.environ.get("JUPYTER_RUNTIME_DIR"):
        found.append(os.environ["JUPYTER_RUNTIME_DIR"])
    if os.environ.get("JUPYTER_DATA_DIR"):
        found.append(os.path.join(os.environ["JUPYTER_DATA_DIR"], "runtime"))
    if os.environ.get("XDG_DATA_HOME"):
        found.append(os.path.join(os.environ["XDG_DATA_HOME"], "jupyter", "runtime"))
    if os.environ.get("XDG_RUNTIME_DIR"):
        found.append(os.environ["XDG_RUNTIME_DIR"])
    return [os.path.abspath(p) for p in found]


# The entries of HOME_SECRETS that are files (the rest are folders).
HOME_SECRET_FILES = (
    *(".netrc", ".pypirc", ".git-credentials", ".gitconfig"),
    *(".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc", ".zprofile"),
)


def _make_missing_secrets(writable: Iterable[str]) -> None:
    """Make the :data:`HOME_SECRETS` folders a writable bind would show but that are missing, so the view covers them.

    The view can only cover a path that exists (bubblewrap mounts on it), and a
    home bound read-write (a notebook opened in the home itself) would otherwise
    let a run create ``~/.jupyter/jupyter_config.py``, an IPython config or a
    kernelspec, which Jupyter's server, ``jupyter execute`` and the next kernel
    run outside every sandbox.  Each is made empty with mode 0700, as the program
    that owns it would; one that cannot be made (a home of another user) is left
    as it is.  The files of :data:`HOME_SECRET_FILES` are not made (an empty
    ``.bash_profile`` would change what a login shell reads): a run may write
    one where none is (docs/isolation.md says so).
    """
    for home in home_directories():
        if not any(_within(home, bound) for bound in writable) or not os.path.isdir(home):
            continue
        for name in HOME_SECRETS:
            if name not in HOME_SECRET_FILES:
                try:
                    os.makedirs(os.path.join(home, name), mode=0o700)
                except OSError:
                    pass  # there already (FileExistsError), or not ours to make


def secret_paths(extra: Iterable[str] = ()) -> list[str]:
    """Existing paths the view covers whenever a bound directory would show them."""
    found = [*home_directories(), *runtime_directories(), *extra]
    for home in home_directories():
        found += [os.path.join(home, name) for name in HOME_SECRETS]
    return [p for p in dict.fromkeys(os.path.normpath(p) for p in found) if os.path.lexists(p)]


def count_user_tasks(uid: int) -> int:
    """Tasks (processes and threads) of ``uid`` on the whole machine, as RLIMIT_NPROC counts them.

    The launcher counts inside its PID namespace, which shows only the run; the
    kernel counts every task of a uid that has no user namespace of its own, so
    the parent counts for it (proc(5): ``/proc/PID/stat`` field 20, num_threads).
    """
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                total += int(f.read().rsplit(b")", 1)[1].split()[17])
        except (OSError, IndexError, ValueError):
            continue
    return total


# --------------------------------------------------------------------------- command-line options


def add_isolation_options(parser: argparse.ArgumentParser, default: Isolation | None = None) -> None:
    """Add ``--isolation``, ``--network``/``--no-network``, ``--layers``, ``--read-only``, ``--writable``."""
    default = default or Isolation()
    group = parser.add_argument_group("isolation (see `cellbox doctor`)")
    group.add_argument(
        "--isolation",
        choices=MODES,
        default=None,
        help="none: rlimits only; auto: every isolation layer this machine supports; strict: all of them or "
        f"no run (default: {default.mode}"
        + ("; auto when another isolation option is given)" if default.mode == "none" else ")"),
    )
    group.add_argument(
        "--network",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the child use the network (default: no network when isolated)",
    )
    group.add_argument("--layers", metavar="LIST", help=f"layers to use, comma-separated (default: {','.join(LAYERS)})")
    group.add_argument("--read-only", action="append", default=[], metavar="PATH", help="also show PATH, read-only")
    group.add_argument("--writable", action="append", default=[], metavar="PATH", help="also show PATH, writable")


def isolation_from_args(args: argparse.Namespace, default: Isolation | None = None) -> Isolation:
    """Build the :class:`Isolation` of parsed options (see :func:`add_isolation_options`).

    Raises:
        IsolationError: a bad layer name or a relative path, named by its flag.
    """
    default = default or Isolation()
    chosen = args.network is not None or args.layers or args.read_only or args.writable
    mode = args.isolation or ("auto" if chosen and default.mode == "none" else default.mode)
    return Isolation.from_options(
        mode=mode,
        network=default.network if args.network is None else args.network,
        layers=args.layers or default.layers,
        read_only=[os.path.abspath(p) for p in [*default.read_only, *args.read_only]],
        writable=[os.path.abspath(p) for p in [*default.writable, *args.writable]],
        source="--layers" if args.layers else "isolation options",
    )
