"""Hidden tests for lesson 12 (signal_name, read_small_file, what_works),
run by ``cellbox grade`` against 12-beyond-rlimits.ipynb."""

import importlib
import os
import re

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
    assert nb.signal_name(-24) == nb.signal_name(152) == "SIGXCPU"
    assert nb.signal_name(-6) == nb.signal_name(134) == "SIGABRT"
    assert nb.signal_name(130) == "SIGINT"


def test_signal_name_none_for_normal_exit(nb):
    for code in (0, 1, 2, 126, 127, 128):
        assert nb.signal_name(code) is None


def test_signal_name_none_for_a_status_past_the_signals(nb):
    # 255 - 128 = 127: no signal has that number (exit(-1) in a shell gives 255)
    assert nb.signal_name(255) is None


def test_read_small_file_round_trips_binary(nb):
    data = os.urandom(5000) + b"\x00\n\r\xff"
    # Written where the notebook's own process (cellbox grade) can read it, in a folder whose name has a quote.
    folder = os.path.join(submission_tmp_path(), "it's here")
    submission_module("os").makedirs(folder)
    path = os.path.join(folder, "blob.bin")
    submission_module("pathlib").Path(path).write_bytes(data)
    assert nb.read_small_file(path) == data


def test_read_small_file_reads_in_a_child(nb):
    # /proc/self/stat starts with the pid of the process that reads it.
    stat = nb.read_small_file("/proc/self/stat")
    assert isinstance(stat, bytes) and stat.split()[0] != str(submission_module("os").getpid()).encode()


def test_what_works_limits_access_and_results(nb):
    # Not rlimits but another user or Landlock; JSON, never pickle or eval; the Agg backend.
    assert nb.what_works() == {"secrets": "c", "results": "b", "plots": "b"}


def test_read_small_file_never_runs_what_the_child_printed(nb):
    # eval, exec or unpickling the child's stdout would run code the child chose; base64 only ever gives bytes.
    # Only an answer that reads a file is judged by its source (a blank one holds none of those words either).
    path = os.path.join(submission_tmp_path(), "small.txt")
    submission_module("pathlib").Path(path).write_bytes(b"print('hello')\n")
    assert nb.read_small_file(path) == b"print('hello')\n"
    source = submission_module("inspect").getsource(nb.read_small_file)
    assert not re.search(r"(?<![\w])(eval|exec)\s*\(|pickle|marshal|\bdill\b", source)
