"""Hidden tests for lesson 9 (courteous, predict_niceness), run by ``cellbox grade`` against 09-keep-the-machine-responsive.ipynb."""

import importlib
import os
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



def test_courteous_keeps_argv_at_the_end_behind_nice(nb):
    # The grader itself may already run at niceness 19, so the command must say it too.
    command = nb.courteous(["a", "b c"])
    assert command[-2:] == ["a", "b c"]
    assert "nice" in command[:-2]


def test_courteous_child_runs_at_niceness_19(nb):
    command = nb.courteous([sys.executable, "-c", "import os; print(os.nice(0))"])
    assert subprocess.run(command, capture_output=True, text=True).stdout.strip() == "19"


def test_courteous_child_is_in_the_idle_io_class(nb):
    if not shutil.which("ionice"):
        pytest.skip("ionice is not installed")
    assert subprocess.run(nb.courteous(["ionice"]), capture_output=True, text=True).stdout.strip() == "idle"


def test_predict_niceness(nb):
    assert nb.predict_niceness() == {"a": 10, "b": 19, "c": 13, "d": 10}


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
