"""Hidden tests for lesson 3 (run_with_timeout), run by ``cellbox grade`` against 03-timeouts.ipynb."""

import importlib
import time

import pytest

NOTEBOOK, MODULE = "03-timeouts.ipynb", "nb_03_timeouts"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def test_run_with_timeout_ok(nb):
    assert nb.run_with_timeout("x = sum(range(1000))", 10) == "ok"


def test_run_with_timeout_error(nb):
    assert nb.run_with_timeout("raise ValueError('bad')", 10) == "error"


def test_run_with_timeout_times_out_without_raising(nb):
    started = time.monotonic()
    assert nb.run_with_timeout("while True: pass", 0.5) == "timed_out"
    assert time.monotonic() - started < 10
