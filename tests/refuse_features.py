"""Run a command where Landlock, seccomp filters and new user namespaces are refused, as a strict container does.

``python refuse_features.py COMMAND [ARGS...]`` loads a seccomp filter (pyseccomp) that answers
``landlock_*`` and ``clone3`` with ENOSYS, ``seccomp(2)`` and ``prctl(PR_SET_SECCOMP)`` with EINVAL, and
``unshare(2)``/``clone(2)`` with CLONE_NEWUSER with EPERM, then execs COMMAND.  Used by tests/test_containers.py.
"""

from __future__ import annotations

import errno
import os
import sys

import pyseccomp as seccomp

CLONE_NEWUSER = 0x10000000
PR_SET_SECCOMP = 22


def main() -> None:
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for call in ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "clone3"):
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), call)
    rules.add_rule(seccomp.ERRNO(errno.EINVAL), "seccomp")
    rules.add_rule(seccomp.ERRNO(errno.EINVAL), "prctl", seccomp.Arg(0, seccomp.EQ, PR_SET_SECCOMP))
    newuser = seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "unshare", newuser)
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", newuser)
    rules.load()
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
