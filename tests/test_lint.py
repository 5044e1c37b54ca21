"""Lint and types are part of the test command: ``ruff check`` and ``mypy`` (configured in pyproject.toml).

A failure prints the tool's own report, so the fix is one read away.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every directory of Python code the project keeps.
LINTED = ("kernel", "tests", "benchmarks", "examples")


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m TOOL ...`` from the project root with this interpreter."""
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    result = run_tool("ruff", "check", "--no-cache", "--output-format", "concise", *LINTED)
    if result.returncode != 0:
        pytest.fail(f"ruff check {' '.join(LINTED)} found problems:\n{result.stdout}{result.stderr}", pytrace=False)


def test_mypy_finds_nothing() -> None:
    result = run_tool("mypy")
    if result.returncode != 0:
        pytest.fail(f"mypy (config in pyproject.toml) found problems:\n{result.stdout}{result.stderr}", pytrace=False)
