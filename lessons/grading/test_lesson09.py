"""Hidden tests for lesson 9 (courteous, predict_niceness), run by ``cellbox grade`` against 09-keep-the-machine-responsive.ipynb."""

import importlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from cellbox.grading.bridge import submission_module, submission_tmp_path

NOTEBOOK, MODULE = "09-keep-the-machine-responsive.ipynb", "nb_09_keep_the_machine_responsive"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



def _after(command, program):
    """The words after ``program`` in ``command`` (up to the argv at its end), or None without it."""
    for at, word in enumerate(command):
        if os.path.basename(word) == program:
            return [*command[at + 1:], ""]
    return None


def _nice_adjustment(command):
    """What ``nice`` adds in ``command`` (nice(1): -n N, -nN, --adjustment=N, the old -N; 10 without), or None."""
    rest = _after(command, "nice")
    if rest is None:
        return None
    first = rest[0]
    if first in ("-n", "--adjustment"):
        value = rest[1]
    elif first.startswith("--adjustment="):
        value = first.split("=", 1)[1]
    elif first.startswith("-n"):
        value = first[2:]
    elif re.fullmatch(r"-[0-9]+", first):
        value = first[1:]
    elif re.fullmatch(r"[+]?[0-9]+", first):
        return None  # `nice 19 cmd` runs a program called 19
    else:
        value = "10"
    return int(value) if re.fullmatch(r"[-+]?[0-9]+", value) else None


def _io_class(command):
    """The class ``ionice`` is given in ``command`` (ionice(1): -c N, -cN, --class N, --class=N), '' or None."""
    rest = _after(command, "ionice")
    if rest is None:
        return None
    for first, second in zip(rest, rest[1:]):
        if first in ("-c", "--class"):
            return second
        if first.startswith("--class="):
            return first.split("=", 1)[1]
        if first.startswith("-c") and len(first) > 2:
            return first[2:]
    return ""


def test_courteous_keeps_argv_at_the_end_behind_nice_19(nb):
    # The grader itself may already run at niceness 19, so the command must say it too.
    command = nb.courteous(["a", "b c"])
    assert command[-2:] == ["a", "b c"]
    added = _nice_adjustment(command[:-2])
    assert added is not None and added >= 19


def test_courteous_asks_for_the_idle_io_class(nb):
    if not shutil.which("ionice"):
        pytest.skip("ionice is not installed")
    assert _io_class(nb.courteous(["a"])[:-1]) in ("3", "idle")


def test_courteous_child_runs_at_niceness_19(nb):
    command = nb.courteous([sys.executable, "-c", "import os; print(os.nice(0))"])
    assert subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip() == "19"


def test_courteous_child_is_in_the_idle_io_class(nb):
    if not shutil.which("ionice"):
        pytest.skip("ionice is not installed")
    assert subprocess.run(nb.courteous(["ionice"]), capture_output=True, text=True, timeout=30).stdout.strip() == "idle"


def test_predict_niceness(nb):
    guesses = nb.predict_niceness()
    assert guesses == {"a": 10, "b": 19, "c": 13, "d": 10}
    assert all(type(value) is int for value in guesses.values())


def test_courteous_leaves_the_notebooks_own_niceness(nb):
    os_ = submission_module("os")
    before = os_.nice(0)
    nb.courteous(["true"])
    assert os_.nice(0) == before


def test_courteous_leaves_ionice_out_where_it_is_missing(nb):
    os_ = submission_module("os")
    empty = os.path.join(submission_tmp_path(), "no-ionice")
    os_.makedirs(empty, exist_ok=True)
    path = os_.environ.get("PATH", "")
    os_.environ.update({"PATH": empty})
    try:
        command = nb.courteous(["true"])
    finally:
        os_.environ.update({"PATH": path})
    assert "ionice" not in " ".join(map(str, command))
