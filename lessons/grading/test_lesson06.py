"""Hidden tests for lesson 6 (run_both_clocks, which_clock, how_long),
run by ``cellbox grade`` against 06-both-clocks.ipynb."""

import importlib
import time

import pytest

NOTEBOOK, MODULE = "06-both-clocks.ipynb", "nb_06_both_clocks"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



def test_run_both_clocks_ok_and_error(nb):
    assert nb.run_both_clocks("pass", 2, 10) == "ok"
    assert nb.run_both_clocks("import sys; sys.exit(9)", 2, 10) == "error"


def test_run_both_clocks_spinning_is_cpu_limit(nb):
    assert nb.run_both_clocks("x = 0\nwhile True: x += 1", 1, 30) == "cpu_limit"


def test_run_both_clocks_blocked_socket_is_timed_out(nb):
    code = "import socket\na, b = socket.socketpair()\na.recv(1)"
    started = time.monotonic()
    assert nb.run_both_clocks(code, 1, 1) == "timed_out"
    assert time.monotonic() - started < 10


def test_which_clock(nb):
    assert nb.which_clock() == {"a": "cpu_limit", "b": "timed_out", "c": "timed_out", "d": "ok"}


def test_how_long_measures_a_sleeper_on_the_wall_clock(nb):
    assert 0.9 <= nb.how_long("import time; time.sleep(1)") < 10
