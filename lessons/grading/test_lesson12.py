"""Hidden tests for lesson 12 (signal_name, read_small_file, what_works),
run by ``cellbox grade`` against 12-beyond-rlimits.ipynb."""

import importlib
import os

import pytest

from cellbox.grading.bridge import submission_module, submission_tmp_path

NOTEBOOK, MODULE = "12-beyond-rlimits.ipynb", "nb_12_beyond_rlimits"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



def test_signal_name_from_python_and_shell_codes(nb):
    assert nb.signal_name(-9) == nb.signal_name(137) == "SIGKILL"
    assert nb.signal_name(-15) == nb.signal_name(143) == "SIGTERM"
    assert nb.signal_name(-24) == "SIGXCPU"


def test_signal_name_none_for_normal_exit(nb):
    for code in (0, 1, 2, 127, 128):
        assert nb.signal_name(code) is None


def test_read_small_file_round_trips_binary(nb):
    data = os.urandom(5000) + b"\x00\n\r\xff"
    # Written where the notebook's own process (cellbox grade) can read it.
    path = os.path.join(submission_tmp_path(), "blob.bin")
    submission_module("pathlib").Path(path).write_bytes(data)
    assert nb.read_small_file(path) == data


def test_what_works_limits_access_and_results(nb):
    # Not rlimits but another user or Landlock; JSON, never pickle or eval; the Agg backend.
    assert nb.what_works() == {"secrets": "c", "results": "b", "plots": "b"}
