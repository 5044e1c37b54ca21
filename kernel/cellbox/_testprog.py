"""``python -m cellbox._testprog CODE [ARGS...]``: run Python source as a module entry point.

The same as ``python -c CODE``, but as ``-m``, so a fork server can take it:
the sandbox's adversarial tests run each hostile program both ways.
"""

import sys

if __name__ == "__main__":
    source = sys.argv[1]
    sys.argv = ["-c", *sys.argv[2:]]
    exec(compile(source, "<string>", "exec"), globals())  # noqa: S102 - running the given program is the point
