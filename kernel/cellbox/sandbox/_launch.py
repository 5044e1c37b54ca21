"""Child side of the sandbox: a supervisor that starts the command under limits.

Standard library only, and never imported by the parent: the parent runs this
file with ``python -I -S _launch.py SPEC`` in a new session, so no Python code
runs in the parent between fork and exec (design rule 1).  Two processes come
out of it:

* the **supervisor** (this process) makes itself a child subreaper
  (prctl(2) ``PR_SET_CHILD_SUBREAPER``), so every descendant that leaves the
  process group (``setsid``, a double fork) is re-parented to it and can still
  be found.  It obeys the parent's control pipe (``interrupt``, ``kill``),
  reaps, kills whatever is left when the command ends, and reports the exit
  status and rusage (getrusage(2), wait4(2)) as one JSON line on the status pipe.
  When the control pipe closes (the parent died) it kills everything and exits.
* the **command**, forked from it: its own process group, rlimits
  (setrlimit(2)), nice, I/O class, optional user switch, then ``execvp``.

Protocol, JSON lines on the status pipe: ``{"event": "command", "pid": ...}``,
``{"event": "note", "text": ...}``, ``{"event": "exec_error", "text": ...}`` and
finally ``{"event": "exit", ...}``.
"""

import _signal
import ctypes
import errno
import fcntl
import json
import math
import os
import resource
import select
import signal
import sys

# os.execvp imports warnings lazily (os.get_exec_path); after a switch to
# another user the stdlib may be out of that user's reach, so import it now.
import warnings  # noqa: F401

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13
IOPRIO_CLASSES = {"best-effort": 2, "idle": 3}
# ioprio_set(2) has no wrapper in glibc; the syscall number depends on the machine.
SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "i686": 289, "armv7l": 314, "ppc64le": 273, "s390x": 282}
# Signals whose ignored state would survive exec and change how the command behaves.
RESET_SIGNALS = ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD", "SIGXCPU")
# File descriptors the launcher keeps for itself are moved at or above this
# number, out of the way of the numbers the command is given (3, 4, ...).
HIGH_FD = 100


def high_fd():
    """:data:`HIGH_FD`, or lower when the inherited RLIMIT_NOFILE would refuse it (fcntl(2) F_DUPFD: EINVAL)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HIGH_FD if soft == resource.RLIM_INFINITY or soft > 2 * HIGH_FD else max(soft // 2, 8)


_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def emit(fd, record):
    """Write one JSON line to the status pipe (small: one atomic write)."""
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError:
        pass


def note(fd, text):
    emit(fd, {"event": "note", "text": text})


# --------------------------------------------------------------------------- command side


def count_user_tasks(uid):
    """Tasks (processes and threads) owned by ``uid``: RLIMIT_NPROC counts these."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[17])
        except (OSError, IndexError, ValueError):
            continue
    return total


# Names of the design's limits, for the notes about a limit that was capped.
RLIMIT_WORDS = {
    resource.RLIMIT_CPU: ("cpu_time", "RLIMIT_CPU"),
    resource.RLIMIT_FSIZE: ("file_size", "RLIMIT_FSIZE"),
    resource.RLIMIT_NOFILE: ("open_files", "RLIMIT_NOFILE"),
    resource.RLIMIT_AS: ("memory", "RLIMIT_AS"),
    resource.RLIMIT_NPROC: ("processes", "RLIMIT_NPROC"),
}
# Thread stacks (glibc sizes them from RLIMIT_STACK's soft limit, pthread_create(3))
# are reserved whole under RLIMIT_AS: one per this many bytes of the memory limit,
# between the two bounds, so 64 threads fit under 256M.
STACK_SHARE = 128
STACK_MIN, STACK_MAX = 1024**2, 8 * 1024**2


def set_limit(which, soft, hard, status_fd):
    """setrlimit(2), capped at the hard limit this process inherited, with a note when capped.

    A limit the parent was given is never raised (root could; anyone else gets
    EPERM, which used to end the run with a silent exit 126).
    """
    _old_soft, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY and hard > old_hard:
        word, name = RLIMIT_WORDS.get(which, (str(which), str(which)))
        text = f"{word}: capped at the hard limit this process inherited ({name} {old_hard}, asked for {hard})"
        note(status_fd, text)
        # RLIMIT_CPU keeps its second between SIGXCPU and SIGKILL where it can.
        gap = hard - soft
        hard = old_hard
        soft = max(min(soft, hard - gap), min(1, hard))
    resource.setrlimit(which, (soft, hard))


def soft_only_hard(which, soft):
    """The hard limit a session's run keeps: the one it inherited (only the soft limit is the run's)."""
    return resource.getrlimit(which)[1]


def thread_stack_size(memory):
    """RLIMIT_STACK's soft limit for a run with ``memory`` bytes of address space (``None``: unchanged)."""
    if not memory:
        return None
    return min(max(memory // STACK_SHARE, STACK_MIN), STACK_MAX)


M_ARENA_MAX = -8  # mallopt(3)
ARENAS = 2  # as MALLOC_ARENA_MAX in the environment allowlist (environment.FIXED)


def set_thread_defaults(stack):
    """The same thread stack size and arena cap in this process as a new program gets from its start.

    glibc reads RLIMIT_STACK and MALLOC_ARENA_MAX once, when a program starts:
    a fork-server child runs the module in the server's interpreter, so it
    sets both here (pthread_setattr_default_np(3), mallopt(3)).  Best effort.
    """
    lib = libc()
    try:
        lib.mallopt(M_ARENA_MAX, ARENAS)
        attr = ctypes.create_string_buffer(128)  # a pthread_attr_t (56 bytes on x86_64)
        if lib.pthread_attr_init(attr) == 0:
            lib.pthread_attr_setstacksize(attr, ctypes.c_size_t(stack))
            lib.pthread_setattr_default_np(attr)
            lib.pthread_attr_destroy(attr)
    except AttributeError:
        pass  # not glibc


def apply_limits(spec, status_fd):
    limits = spec["limits"]
    cpu = int(math.ceil(limits["cpu_time"]))
    # The soft limit sends SIGXCPU; the hard limit one second later is SIGKILL,
    # for programs that catch or ignore SIGXCPU (setrlimit(2)).
    wanted = [
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, limits["file_size"], limits["file_size"]),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
    ]
    if limits.get("memory"):
        wanted.append((resource.RLIMIT_AS, limits["memory"], limits["memory"]))
    for which, soft, hard in wanted:
        if spec.get("soft_limits"):
            # A run forked from a session's snapshot: its process image becomes the
            # next snapshot, and a hard limit lowered now could never be raised for
            # a later cell that is given more (setrlimit(2)).
            hard = soft_only_hard(which, soft)
            soft = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
        set_limit(which, soft, hard, status_fd)
    stack = thread_stack_size(limits.get("memory"))
    old_soft, old_hard = resource.getrlimit(resource.RLIMIT_STACK)
    if stack is not None and (old_soft == resource.RLIM_INFINITY or old_soft > stack):
        # Only the soft limit: a program that needs a deeper main stack may raise it (ulimit -s).
        resource.setrlimit(resource.RLIMIT_STACK, (stack, old_hard))
        set_thread_defaults(stack)
    if spec.get("nproc_extra") is not None:
        uid = os.getuid() if spec.get("uid") is None else spec["uid"]
        if uid == 0:
            note(status_fd, "processes: not enforced by RLIMIT_NPROC for root (no writable pids cgroup)")
        else:
            # In a PID namespace the parent counted the uid's tasks machine-wide
            # ("nproc_base"): /proc here shows only the run's own.
            base = spec["nproc_base"] if spec.get("nproc_base") is not None else count_user_tasks(uid)
            n = base + spec["nproc_extra"]
            hard = soft_only_hard(resource.RLIMIT_NPROC, n) if spec.get("soft_limits") else n
            set_limit(resource.RLIMIT_NPROC, n if hard == resource.RLIM_INFINITY else min(n, hard), hard, status_fd)


def apply_priority(spec, status_fd, exact=False):
    """Set the command's niceness and I/O class.

    A spawned command only ever lowers its priority.  A fork-server child
    (``exact``) starts at the server's low priority and is set to the run's
    value both ways, which needs CAP_SYS_NICE to go back up (setpriority(2)).
    """
    nice = spec["limits"]["nice"]
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if nice > current or (exact and nice != current):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        note(status_fd, f"nice: could not be set ({exc.strerror})")
    io_class = spec["limits"]["io_class"]
    if io_class == "none":
        return
    number = SYS_IOPRIO_SET.get(os.uname().machine)
    if number is None:
        note(status_fd, f"io_class: ioprio_set is unknown on {os.uname().machine}")
        return
    value = IOPRIO_CLASSES[io_class] << IOPRIO_CLASS_SHIFT
    if libc().syscall(number, IOPRIO_WHO_PROCESS, 0, value) != 0:
        note(status_fd, f"io_class: could not be set ({os.strerror(ctypes.get_errno())})")


def place_fds(moves):
    """dup2 each (source, target) pair, safely when sources and targets overlap."""
    parked = [(fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, high_fd()), target) for source, target in moves]
    targets = {target for _source, target in moves}
    for source, _target in moves:
        if source not in targets:
            os.close(source)
    for high, target in parked:
        os.dup2(high, target, inheritable=True)
        os.close(high)


def switch_user(spec):
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is None:
        return
    os.setgroups(spec.get("groups") or [gid])
    os.setgid(gid)
    os.setuid(uid)


PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS and SECBIT_NO_CAP_AMBIENT_RAISE,
# each with its _LOCKED bit (linux/securebits.h): exec never gives uid 0 capabilities again.
SECUREBITS_NO_ROOT = 0b11_1111 | 0b11 << 6
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities():
    """Keep uid 0 and lose every power of root's, for good (capabilities(7), programs run by root).

    Securebits (locked) stop exec from handing uid 0 its capabilities again,
    the bounding set is emptied, then capset(2) clears the effective, permitted
    and inheritable sets.  What is left is the owner of root's files and nothing
    more.  Raises OSError when the kernel refuses a step.
    """
    lib = libc()
    if lib.prctl(PR_SET_SECUREBITS, SECUREBITS_NO_ROOT, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "securebits could not be set")
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), f"capability {cap} could not be dropped")
    lib.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}, all zero
    if lib.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def check_reachable(spec):
    """Fail with a sentence, not errno, when the command cannot be reached."""
    who = f"user {spec['user']!r}" if spec.get("user") else "the sandbox"
    cwd = spec["cwd"]
    try:
        os.chdir(cwd)
    except OSError as exc:
        return f"{who} cannot enter the working directory {cwd} ({exc.strerror})"
    program = spec["argv"][0]
    if os.sep not in program:
        return None  # looked up on PATH by execvp, which names the failure itself
    try:
        os.stat(program)
    except PermissionError:
        return f"{who} cannot run {program}: it is not open to them"
    except FileNotFoundError:
        return f"{who} cannot run {program}: it does not exist"
    if not os.access(program, os.X_OK):
        return f"{who} cannot run {program}: it is not executable for them"
    return None


# Landlock (landlock(7), linux/landlock.h): the same syscall numbers on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38
# Filesystem rights each ABI version knows: 1 has bits 0-12, 2 adds REFER,
# 3 TRUNCATE, 5 IOCTL_DEV.  READ covers reading and running files.
LANDLOCK_FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}
LANDLOCK_READ = 1 << 0 | 1 << 2 | 1 << 3  # EXECUTE, READ_FILE, READ_DIR
LANDLOCK_FILE_ONLY = 1 << 0 | 1 << 1 | 1 << 2 | 1 << 14 | 1 << 15  # rights a rule on a file may hold
LANDLOCK_NET_TCP = 1 << 0 | 1 << 1  # BIND_TCP, CONNECT_TCP (ABI 4)
LANDLOCK_SCOPES = 1 << 0 | 1 << 1  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)
LANDLOCK_SCOPE_SIGNAL = 1 << 1
LANDLOCK_MAKE_DEVICE = 1 << 6 | 1 << 11  # MAKE_CHAR, MAKE_BLOCK


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def apply_landlock(rules):
    """Restrict this process and everything it starts to ``rules`` (landlock(7)).

    ``rules`` has ``read`` and ``write`` path lists, ``deny_tcp`` and
    ``scope``.  Returns the kernel's Landlock ABI; raises OSError when the kernel refuses.
    """
    lib = libc()
    abi = lib.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    handled = (1 << LANDLOCK_FS_BITS.get(abi, 16)) - 1
    fields = [handled]
    if abi >= 4:
        fields.append(LANDLOCK_NET_TCP if rules.get("deny_tcp") else 0)
    if abi >= 6:
        fields.append(LANDLOCK_SCOPES if rules.get("scope") else 0)
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = lib.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        # Writable places get every right but making device nodes (a block device of the root disk, as root).
        for rights, paths in ((LANDLOCK_READ, rules["read"]), (handled & ~LANDLOCK_MAKE_DEVICE, rules["write"])):
            for path in paths:
                add_landlock_rule(ruleset, path, rights & handled)
        if libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no_new_privs could not be set")
        if lib.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def add_landlock_rule(ruleset, path, rights):
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this machine (or not in the view): nothing to allow
    try:
        if not os.path.isdir(path):
            rights &= LANDLOCK_FILE_ONLY
        rule = _PathBeneath(rights, fd)
        if libc().syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)


def join_cgroup(path):
    """Move this process into the cgroup at ``path`` (cgroups(7), ``cgroup.procs``).  Raises OSError."""
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def prepare_command(spec, status_fd, exact_priority=False):
    """In the command's process: group, signals, fds, priority, user, limits, Landlock.

    The one implementation of the command's set-up, for the spawned launcher
    (then ``execvp``) and for a fork-server child (then the module runs in this
    interpreter).  Returns the status fd, moved high and close-on-exec.
    Exits with 126 after an ``exec_error`` record when the working directory
    or the program is out of reach, or a step fails: the record goes to the
    moved fd, which the caller does not know yet.
    """
    signal.set_wakeup_fd(-1)
    # Keep the status pipe out of the command's way; close-on-exec drops it.
    inherited, status_fd = status_fd, fcntl.fcntl(status_fd, fcntl.F_DUPFD_CLOEXEC, high_fd())
    os.close(inherited)
    try:
        problem = set_up_command(spec, status_fd, exact_priority)
    except BaseException as exc:  # noqa: BLE001 - reported, never back into the caller with a stale fd
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or repr(exc)
        problem = f"cannot start the command: {reason}"
    if problem:
        emit(status_fd, {"event": "exec_error", "text": problem})
        os._exit(126)
    return status_fd


# Every signal number of this machine, as plain ints (signal(7)).
ALL_SIGNALS = _signal.valid_signals()


def raw_sigmask(how, signals):
    """pthread_sigmask(3) with ints in and a set of ints out: ``signal.pthread_sigmask`` without its enums.

    The ``signal`` module's wrapper turns every number in and out into a
    ``signal.Signals`` member, about 1 microsecond each: a cell's end blocks
    every signal, and the next command starts with that mask, so the wrapper
    cost every cell about 0.14 ms (measured: 137 us against 2 us for a block
    and a restore of all of them).
    """
    return _signal.pthread_sigmask(how, signals)


def set_up_command(spec, status_fd, exact_priority):
    """The steps of :func:`prepare_command`; returns a sentence when the command is out of reach."""
    os.setpgid(0, 0)
    for name in RESET_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    raw_sigmask(signal.SIG_SETMASK, ())
    for path in [spec.get("cgroup"), *spec.get("cgroups", [])]:
        if path:
            join_cgroup(path)
    place_fds(spec.get("fds", []))
    apply_priority(spec, status_fd, exact=exact_priority)
    switch_user(spec)
    if spec.get("drop_caps"):
        drop_capabilities()
    if spec.get("no_new_privs") and libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs could not be set")
    apply_limits(spec, status_fd)
    problem = check_reachable(spec)
    if problem:
        return problem
    scoped = False
    if spec.get("landlock"):
        try:
            scoped = apply_landlock(spec["landlock"]) >= 6 and bool(spec["landlock"].get("scope"))
        except OSError as exc:
            if spec["landlock"].get("required"):
                raise
            note(status_fd, f"landlock: not applied ({exc.strerror or exc})")
    if spec.get("signal_scope") and not scoped:
        apply_signal_scope(status_fd)
    if spec.get("seccomp"):
        load_seccomp(bytes.fromhex(spec["seccomp"]))
    return None


PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_INSTRUCTION_SIZE = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program):
    """Install a seccomp BPF ``program`` (built by the parent with libseccomp) on this process.

    Last step before exec: it holds for the command and everything it starts
    (seccomp(2)).  Needs ``no_new_privs``, set earlier.  Raises OSError.
    """
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // BPF_INSTRUCTION_SIZE, ctypes.addressof(buffer))
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the syscall filter could not be loaded")


def apply_signal_scope(status_fd):
    """Keep the command's signals (and ptrace) inside its run, in every isolation mode.

    A Landlock domain that handles no file or network access, only the
    signal scope (landlock(7), ABI 6, Linux 6.12): the command and everything
    it starts can no longer signal the supervisor or the parent, nor ptrace
    them (a Landlock domain never may ptrace outside itself).  Needs
    ``no_new_privs`` (set-user-ID programs then run without their powers) or,
    for root, CAP_SYS_ADMIN.  A note says why when the kernel cannot.
    """
    lib = libc()
    abi = lib.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 6:
        why = "the kernel has no Landlock" if abi < 1 else f"the kernel's Landlock is ABI {abi}, not 6 (Linux 6.12)"
        note(status_fd, f"signal-scope: not applied ({why}); the program can signal its supervisor")
        return
    attr = (ctypes.c_uint64 * 3)(0, 0, LANDLOCK_SCOPE_SIGNAL)
    ruleset = lib.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        note(status_fd, f"signal-scope: not applied ({os.strerror(ctypes.get_errno())})")
        return
    try:
        if os.geteuid() != 0 and lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            note(status_fd, f"signal-scope: not applied (no_new_privs: {os.strerror(ctypes.get_errno())})")
        elif lib.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            note(status_fd, f"signal-scope: not applied ({os.strerror(ctypes.get_errno())})")
    finally:
        os.close(ruleset)


def start_command(spec, status_fd):
    """In the forked child: limits, priority, user, then exec.  Never returns."""
    try:
        status_fd = prepare_command(spec, status_fd)
        argv = spec["argv"]
        os.execvp(argv[0], argv)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        emit(status_fd, {"event": "exec_error", "text": f"cannot run {spec['argv'][0]}: {reason}"})
        os._exit(127 if exc.errno == errno.ENOENT else 126)
    except BaseException as exc:  # pragma: no cover - last resort, never return into the supervisor
        emit(status_fd, {"event": "exec_error", "text": f"cannot start the command: {exc!r}"})
        os._exit(126)


# --------------------------------------------------------------------------- supervisor side


def descendants(root, extra_pids=()):
    """Live descendants of ``root`` (zombies excluded), found through /proc ppid links."""
    children = {}
    state = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                after = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        state[pid] = after[0]
        children.setdefault(int(after[1]), []).append(pid)
    found = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    found.extend(p for p in extra_pids if p in state and p not in found and p != root)
    return [p for p in found if state.get(p) != b"Z"]


def control_words(fd):
    """The words the parent wrote on a run's control pipe; ``[b"kill"]`` once it is gone (end of file).

    A parent that went away leaves nothing of the run behind.
    """
    try:
        data = os.read(fd, 512)
    except OSError:
        data = b""
    return data.split() if data else [b"kill"]


def kill_processes(group, pids):
    """SIGKILL the process group ``group`` (unless ``None``) and each of ``pids``; those already gone are skipped."""
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def cgroup_pids(path):
    if not path:
        return []
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []


class Supervisor:
    def __init__(self, spec, status_fd, control_fd, child):
        self.spec = spec
        self.status_fd = status_fd
        self.control_fd = control_fd
        self.child = child
        self.child_status = None
        self.child_rusage = None
        self.killed = set()
        self.kill_requested = False
        self.interrupted = False

    def reap(self):
        """Reap every exited child; remember the command's status and rusage."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False  # no children at all: nothing of the run is left
            if pid == 0:
                return True
            if pid == self.child:
                self.child_status, self.child_rusage = status, usage

    def kill_all(self):
        """SIGKILL the command's group and every descendant until none is left.

        Ends only when this process has no child at all (wait4 says ECHILD): a
        scan of /proc can miss a process that is being forked or re-parented to
        us at that moment, so an empty scan is not proof that the run is over.
        """
        me = os.getpid()
        while True:
            # Look before killing: once the group is killed its members are
            # zombies, and the count of processes stopped would come out short.
            pids = descendants(me, cgroup_pids(self.spec.get("cgroup")))
            self.killed.update(pid for pid in pids if pid != self.child)
            kill_processes(self.child if self.child_status is None else None, pids)
            if not self.reap():
                return
            if not pids:
                # A child is still exiting, or was just re-parented to us: look again.
                select.select([], [], [], 0.005)

    def on_control(self):
        for word in control_words(self.control_fd):
            if word == b"interrupt":
                self.interrupted = True
                try:
                    os.killpg(self.child, signal.SIGINT)
                except OSError:
                    pass
            elif word == b"kill":
                self.kill_requested = True
                self.kill_all()

    def run(self, wakeup_fd):
        while self.child_status is None:
            ready, _, _ = select.select([self.control_fd, wakeup_fd], [], [])
            if wakeup_fd in ready:
                try:
                    os.read(wakeup_fd, 4096)
                except OSError:
                    pass
            if self.control_fd in ready:
                self.on_control()
            self.reap()
        if self.reap():
            # The command is done; anything it left running (a daemon, a pool) goes now.
            self.kill_all()
        self.report()

    def report(self):
        status = self.child_status
        record = {"event": "exit", "killed": len(self.killed), "kill_requested": self.kill_requested}
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit_code"] = os.WEXITSTATUS(status)
        mine = self.child_rusage
        total = resource.getrusage(resource.RUSAGE_CHILDREN)
        record["command_cpu"] = mine.ru_utime + mine.ru_stime
        record["cpu"] = total.ru_utime + total.ru_stime
        record["peak_kib"] = max(total.ru_maxrss, mine.ru_maxrss)
        if self.spec.get("disk_watch"):
            record["disk_full"] = disk_full(self.spec["disk_watch"])
        emit(self.status_fd, record)


# Free bytes below which the run's task tmpfs counts as full: a write that did not fit
# fills what is left, then fails with ENOSPC, so what stays free is less than a page or two.
DISK_FULL_SLACK = 1024**2


def disk_full(path):
    """Whether the tmpfs at ``path`` (the run's ``disk`` limit) is full now, as the run left it (statvfs(3))."""
    try:
        info = os.statvfs(path)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < DISK_FULL_SLACK


def become_subreaper(status_fd):
    """Make this process a child subreaper (prctl(2)); say so on the status pipe when it cannot.

    Also makes it not dumpable (PR_SET_DUMPABLE 0): a program of the same
    user can then neither ptrace it nor read its ``/proc/PID/mem`` or
    ``environ`` (proc(5)); the command's own exec makes the command dumpable again.
    """
    try:
        if libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            note(status_fd, "subreaper: prctl failed; a setsid daemon may escape the kill")
        libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        note(status_fd, "subreaper: not available; a setsid daemon may escape the kill")


def supervisor_signals():
    """The supervisor's signal set-up; returns the read end of its wake-up pipe."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # The parent decides when the run ends; a stray SIGINT/SIGTERM to the group
    # must not take the supervisor away before it has cleaned up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return wake_r, wake_w


def supervise(spec, status_fd, control_fd, child, wake_r, command_fds):
    """Drop the command's streams, then supervise ``child`` to its end and report."""
    # The parent's way to the run's processes should this supervisor be killed before it reports.
    emit(status_fd, {"event": "command", "pid": child})
    # The supervisor keeps none of the command's streams, so the parent sees
    # end-of-file as soon as the command's processes are gone.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for fd in command_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    Supervisor(spec, status_fd, control_fd, child).run(wake_r)


def main():
    spec = json.loads(sys.argv[1])
    status_fd, control_fd = spec["status_fd"], spec["control_fd"]
    become_subreaper(status_fd)
    wake_r, wake_w = supervisor_signals()
    child = os.fork()
    if child == 0:
        os.close(wake_r)
        os.close(wake_w)
        os.close(control_fd)
        start_command(spec, status_fd)
    supervise(spec, status_fd, control_fd, child, wake_r, [source for source, _target in spec.get("fds", [])])
    # Reported, and nothing of the run is left: skip the interpreter's shutdown
    # (its garbage collection and module teardown took milliseconds the parent waited for).
    os._exit(0)


if __name__ == "__main__":
    main()
