"""Shared fixtures of the cellbox test suite.

``require_tool`` is how a test asks for an outside program (``groovy``,
``chromium``).  On a developer's machine a missing tool skips the test with a
reason; in CI (``CELLBOX_REQUIRE_ALL=1``, set by ``.ci/run``) it fails, so a
test can never pass in CI by quietly not running.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

# Set by .ci/run: every test must run, none may skip for a missing tool.
REQUIRE_ALL_VARIABLE = "CELLBOX_REQUIRE_ALL"


def require_all() -> bool:
    """``True`` when missing tools must fail tests instead of skipping them (CI)."""
    return os.environ.get(REQUIRE_ALL_VARIABLE, "") not in ("", "0")


def find_tool(name: str, *, install: str | None = None) -> str:
    """Return the path of the program ``name``, or skip (fail in CI) the calling test.

    Args:
        name: a program looked up on ``PATH``, such as ``groovy``.
        install: how to get it, for the message (default: ``apt-get install NAME``).

    Raises:
        pytest.skip.Exception: the tool is missing on a developer's machine.
        pytest.fail.Exception: the tool is missing and ``CELLBOX_REQUIRE_ALL`` is set.
    """
    path = shutil.which(name)
    if path:
        return path
    missing(f"{name} is not installed", install or f"apt-get install {name}")


def missing(what: str, install: str) -> NoReturn:
    """Skip the calling test because ``what`` is missing here; fail it instead under ``CELLBOX_REQUIRE_ALL``.

    Args:
        what: what is missing, as a clause: ``"chromium is not installed"``.
        install: how to get it: ``"apt-get install chromium"``.

    Raises:
        pytest.skip.Exception: on a developer's machine.
        pytest.fail.Exception: in CI (``CELLBOX_REQUIRE_ALL`` set), so nothing passes by not running.
    """
    if require_all():
        pytest.fail(f"{what} and {REQUIRE_ALL_VARIABLE} is set; install it ({install}) in .ci/run")
    pytest.skip(f"{what}; install it ({install}) to run this test")


@pytest.fixture(scope="session")
def require_tool() -> Callable[..., str]:
    """The :func:`find_tool` function: ``groovy = require_tool("groovy")`` inside a test."""
    return find_tool


@pytest.fixture
def victim() -> Iterator[Path]:
    """A folder of this test's user outside every run (mode 0o755), with a file in it (mode 0o600)."""
    folder = Path(tempfile.mkdtemp(prefix="cellbox-victim-", dir="/var/tmp"))
    folder.chmod(0o755)
    (folder / "secret").write_text("secret\n")
    (folder / "secret").chmod(0o600)
    try:
        yield folder
    finally:
        folder.chmod(0o700)
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
