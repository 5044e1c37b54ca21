"""Hidden tests for lesson 1 (run_isolated), run by ``cellbox grade`` against 01-separate-process.ipynb."""

import importlib

import pytest

NOTEBOOK, MODULE = "01-separate-process.ipynb", "nb_01_separate_process"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def test_run_isolated_reports_success_and_output(nb):
    assert nb.run_isolated("print('a', 'b')") == (True, "a b\n", "")


def test_run_isolated_reports_failure_and_stderr(nb):
    ok, out, err = nb.run_isolated("import sys; print('partial'); sys.exit('nope')")
    assert ok is False
    assert out == "partial\n"
    assert err.strip() == "nope"


def test_run_isolated_keeps_changes_in_the_child(nb):
    ok, _, _ = nb.run_isolated("import builtins; builtins.len = None")
    assert ok is True
    assert len("abc") == 3
