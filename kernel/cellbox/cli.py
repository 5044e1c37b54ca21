"""The ``cellbox`` command line: ``run`` here; other subcommands register from their modules.

Only :func:`main` chooses exit codes; every command is testable as
``main(["run", ...])``.  Bad input ends in one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import typing
from collections.abc import Sequence

from . import __version__
from .options import add_limit_options, limits_from_args
from .sandbox import SandboxError, run
from .sandbox.importpath import trusted_sys_path
from .sandbox.isolation import Isolation, IsolationError, add_isolation_options, isolation_from_args
from .sandbox.limits import LimitError
from .sandbox.outcome import STATUS_EXIT_CODES, Outcome

__all__ = ["main", "UsageError"]

# Subcommands that live beside their feature; each module has
# ``add_parser(subparsers) -> None`` and sets ``func`` on its parser.
FEATURE_COMMANDS: tuple[str, ...] = (
    "cellbox.kernelspec",
    "cellbox.grading.cli",
    "cellbox.doctor",
    "cellbox.lessons",
)


# What running the child as root means, in the words of the README's section Running as root.
ROOT_WARNING = (
    "cellbox: warning: the child ran as root, so the limits did not contain it: root may raise its own limits, "
    "and it could read and change any file and stop any process on this machine "
    "(use --user NAME to run it as an unprivileged user)"
)

# `cellbox run`'s isolation when none is chosen: the strongest layers this machine has, as grading and the kernel.
RUN_ISOLATION = Isolation(mode="auto")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _add_run(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a Python file or a command in the sandbox",
        description="Run FILE.py (with this Python) or -- CMD ARGS... in a fresh child process under limits "
        "and isolation auto (every layer this machine has; as root, the program keeps uid 0 for the working "
        "directory and none of root's powers); print its output and a one-line status.",
        epilog="exit status: "
        + ", ".join(f"{code} {status.value}" for status, code in STATUS_EXIT_CODES.items())
        + "; 2 bad input; 130 cellbox itself interrupted",
    )
    add_limit_options(parser)
    add_isolation_options(parser, default=RUN_ISOLATION)
    parser.add_argument("--json", action="store_true", help="print the Outcome as one JSON object instead")
    parser.add_argument("--user", help="run the child as this user (needs root)")
    parser.add_argument("--cwd", help="working directory of the child (default: the current directory)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="add a variable to the child's environment"
    )
    parser.add_argument("target", nargs=argparse.REMAINDER, help="FILE.py [ARGS...] or -- CMD [ARGS...]")
    parser.set_defaults(func=_cmd_run)


def _command_for(target: list[str]) -> list[str]:
    if target and target[0] == "--":
        target = target[1:]
    if not target:
        raise UsageError("nothing to run: give FILE.py or -- CMD ARGS...")
    if target[0].endswith(".py"):
        if not os.path.isfile(target[0]):
            raise UsageError(f"{target[0]}: no such file")
        return [sys.executable, os.path.abspath(target[0]), *target[1:]]
    return target


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: write NAME=VALUE")
        env[name] = value
    return env


def _cmd_run(args: argparse.Namespace) -> int:
    limits = limits_from_args(args)
    command = _command_for(args.target)
    isolation = isolation_from_args(args, RUN_ISOLATION)
    if args.user is None:
        # As root the program keeps uid 0, so it reads and writes the working directory it was given
        # (root's own, a private mkdtemp folder), with none of root's capabilities (Isolation.keep_root).
        isolation = dataclasses.replace(isolation, keep_root=True)
    if args.target and args.target[0].endswith(".py"):
        # The program file must be in the child's view, wherever it lies.
        isolation = dataclasses.replace(isolation, read_only=(*isolation.read_only, command[1]))
    live = not args.json
    shown = [0]  # characters of stderr already printed live
    # The stream written last, and whether it ended a line: the status line must start a line of its own.
    last: list[tuple[object, bool]] = [(None, True)]

    def show(stream: typing.TextIO, text: str) -> None:
        stream.write(text)
        stream.flush()
        last[0] = (stream, text.endswith("\n"))

    def show_stderr(text: str) -> None:
        shown[0] += len(text)
        show(sys.stderr, text)

    outcome: Outcome = run(
        command,
        limits=limits,
        cwd=args.cwd or os.getcwd(),
        env=_parse_env(args.env),
        user=args.user,
        isolation=isolation,
        on_stdout=(lambda text: show(sys.stdout, text)) if live else None,
        on_stderr=show_stderr if live else None,
    )
    if args.json:
        print(json.dumps(outcome.to_json()))
    else:
        # The sandbox adds its own message (a command it could not start) to
        # stderr after the stream has ended; print that part too.
        if outcome.stderr[shown[0] :]:
            show(sys.stderr, outcome.stderr[shown[0] :])
        stream, ended = last[0]
        if not ended:
            show(stream, "\n")  # type: ignore[arg-type]
        print(f"cellbox: {outcome.summary()}", file=sys.stderr)
        for note in outcome.notes:
            print(f"cellbox: note: {note}", file=sys.stderr)
        if outcome.as_root:
            print(ROOT_WARNING, file=sys.stderr)
    return STATUS_EXIT_CODES[outcome.status]


def build_parser() -> argparse.ArgumentParser:
    """The full ``cellbox`` parser, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="cellbox",
        description="Run untrusted Python for teaching.",
        epilog="exit status: 0 success, 2 bad input, 130 interrupted; each command's --help gives its own",
    )
    parser.add_argument("--version", action="version", version=f"cellbox {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(subparsers)
    for module in FEATURE_COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is reported with the usage of its subcommand, not of ``cellbox``.

    Raises:
        SystemExit: exit status 2 after argparse's message (bad input), 0 after ``--help``.
    """
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = getattr(args, "command", None)
        sub = _subparsers(parser).get(command) if command else None
        (sub or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cellbox``; returns the exit status.

    The working directory (often a folder of submissions or programs) leaves
    ``sys.path`` first, so no module the commands import later comes from there.
    """
    trusted_sys_path()
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except (UsageError, LimitError, SandboxError, IsolationError) as exc:
        print(f"cellbox {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cellbox {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
