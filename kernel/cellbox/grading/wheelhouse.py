"""A submission's dependencies, fetched by the grader's side into a wheelhouse, so its install runs offline.

A package submission's build backend is code of the submission's (an in-tree
backend, ``backend-path = ["."]``, is whatever it wrote), so its build and
install get no network.  What they need comes first from the trusted side:

1. :func:`requirements_of` reads, as data, the requirements the submission
   declares: the lines of ``requirements.txt``, and for a package its
   ``pyproject.toml``'s ``[build-system] requires`` and ``[project]
   dependencies`` (PEP 518, PEP 621; :mod:`tomllib`), or pip's default backend
   (``setuptools>=40.8.0`` and ``wheel``) when it declares none.  Each must be a
   plain requirement specifier (PEP 508: a name, extras, versions, markers):
   pip options (``--index-url``, ``-e``, ``-r``), URLs and paths are refused
   with a one-line :class:`RequirementError`, so the submission never chooses
   where the grader fetches from.
2. :func:`fetch_command` is ``pip download --only-binary :all:`` of those
   specifiers (written by the grader into its own file) into the task's
   wheelhouse: wheels only, so no code of any package runs while fetching; the
   dependencies of each wheel come along.  ``cellbox grade --find-links`` is
   passed on; pip's own configuration (index, constraints) applies.
3. the install is ``pip install --no-index --find-links WHEELHOUSE``
   (:func:`cellbox.grading.venvs.pip_install_command`) in the sandbox with the
   network off: the ``net`` layer where the machine has it
   (:func:`offline_layers` says which layers kept it offline).

A dependency computed by code (``dynamic = ["dependencies"]``, a ``setup.py``'s
``install_requires``) is not known before the build: it is not fetched, and
the offline install fails with pip's line naming it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..sandbox.isolation import landlock_abi
from .submissions import Layout, SubmissionError

__all__ = [
    "DEFAULT_BACKEND",
    "PYPROJECT_MAX",
    "RequirementError",
    "fetch_command",
    "offline_layers",
    "requirements_of",
]

# pip's build requirements for a package that declares none (pip/_internal/pyproject.py).
DEFAULT_BACKEND = ("setuptools>=40.8.0", "wheel")
PYPROJECT_MAX = 1024 * 1024  # bytes of pyproject.toml read; a larger one is refused
REQUIREMENTS_MAX = 1024 * 1024  # bytes of requirements.txt read; a larger one is refused
REQUIREMENTS_COUNT = 500  # specifiers fetched at most
_COMMENT = re.compile(r"(?:^|\s)#")  # where a comment begins in a requirements file (pip's rule)


class RequirementError(SubmissionError):
    """A requirement the grader will not fetch (an option, a URL, a path, bad syntax); one line."""


def requirements_of(layout: Layout) -> list[str]:
    """The requirement specifiers to fetch for ``layout``, each once, in the order written.

    Raises:
        RequirementError: a line or entry that is not a plain PEP 508 specifier,
            a ``pyproject.toml`` that does not parse, or too many of them.
    """
    found: list[str] = []
    if layout.requirements:
        text = _read(layout.root / "requirements.txt", REQUIREMENTS_MAX)
        for number, line in enumerate(text.splitlines(), 1):
            entry = _COMMENT.split(line, 1)[0].strip()
            if entry:
                found.append(_specifier(entry, f"requirements.txt line {number}"))
    if layout.package:
        found += _package_requirements(layout.root)
    unique = list(dict.fromkeys(found))
    if len(unique) > REQUIREMENTS_COUNT:
        raise RequirementError(f"{len(unique)} requirements; the grader fetches at most {REQUIREMENTS_COUNT}")
    return unique


def _package_requirements(root: Path) -> list[str]:
    """``[build-system] requires`` and ``[project] dependencies`` of ``root/pyproject.toml`` (or pip's default)."""
    path = root / "pyproject.toml"
    data: dict[str, Any] = {}
    if path.is_file() and not path.is_symlink():
        try:
            data = tomllib.loads(_read(path, PYPROJECT_MAX))
        except tomllib.TOMLDecodeError as exc:
            raise RequirementError(f"pyproject.toml does not parse: {exc}") from None
    build = data.get("build-system")
    requires = build.get("requires") if isinstance(build, dict) else None
    if requires is None:
        requires = list(DEFAULT_BACKEND)
    project = data.get("project")
    dependencies = project.get("dependencies", []) if isinstance(project, dict) else []
    found = []
    for where, entries in (("[build-system] requires", requires), ("[project] dependencies", dependencies)):
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise RequirementError(f"pyproject.toml {where}: not a list of strings")
        found += [_specifier(entry, f"pyproject.toml {where}") for entry in entries]
    if any(canonicalize_name(Requirement(entry).name) == "setuptools" for entry in found):
        # setuptools before 70.1 asks for wheel to build a wheel (get_requires_for_build_wheel).
        found.append("wheel")
    return found


def _specifier(entry: str, where: str) -> str:
    """``entry`` when it is a plain PEP 508 specifier (no URL, no option, no path), else RequirementError."""
    shown = entry if len(entry) <= 80 else entry[:77] + "..."
    if entry.startswith("-"):
        raise RequirementError(
            f"{where}: {shown!r} is a pip option; only requirement specifiers (name[extras] versions; markers) "
            "are fetched, from the grader's index"
        )
    try:
        requirement = Requirement(entry)
    except InvalidRequirement:
        raise RequirementError(f"{where}: {shown!r} is not a requirement specifier (PEP 508)") from None
    if requirement.url:
        raise RequirementError(f"{where}: {shown!r} names a URL; only names and versions are fetched")
    return str(requirement)


def _read(path: Path, limit: int) -> str:
    """The text of ``path`` (a regular file of at most ``limit`` bytes), as UTF-8 with replacement."""
    if path.is_symlink() or not path.is_file():
        raise RequirementError(f"{path.name}: not a regular file")
    if path.stat().st_size > limit:
        raise RequirementError(f"{path.name}: larger than {limit} bytes")
    return path.read_bytes().decode("utf-8", errors="replace")


def fetch_command(requirements: Path, wheelhouse: Path, find_links: str | None) -> list[str]:
    """The grader's ``pip download`` of the specifiers in ``requirements`` (a file the grader wrote).

    Wheels only (``--only-binary :all:``): pip never builds, so nothing of a
    fetched package runs.  Run by the grader's side with the network.
    """
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary",
        ":all:",
        "--dest",
        str(wheelhouse),
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
    ]
    if find_links:
        argv += ["--find-links", find_links]
    return [*argv, "-r", str(requirements)]


def offline_layers(isolation: Iterable[str]) -> list[str]:
    """What kept an install offline, from its ``Outcome.isolation``, for the results.

    Always ``pip --no-index``; then the ``net`` layer (a private loopback
    only), or without it the syscall filter that refuses internet sockets, or
    Landlock's TCP rule (ABI 4, landlock(7)).
    """
    active = set(isolation)
    found = ["pip --no-index"]
    if "net" in active:
        found.append("net layer")
    elif "syscall-filter" in active:
        found.append("syscall filter (internet sockets refused)")
    elif "landlock" in active and landlock_abi() >= 4:
        found.append("landlock (TCP refused)")
    return found
