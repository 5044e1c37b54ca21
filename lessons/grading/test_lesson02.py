"""Hidden tests for lesson 2 (reach_os, load_scores), run by ``cellbox grade`` against 02-in-process-sandboxes-fail.ipynb."""

import importlib
import os

import pytest

NOTEBOOK, MODULE = "02-in-process-sandboxes-fail.ipynb", "nb_02_in_process_sandboxes_fail"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def test_reach_os_returns_an_expression(nb):
    assert isinstance(nb.reach_os(), str)


def test_reach_os_escapes_an_eval_without_builtins(nb):
    assert eval(nb.reach_os(), {"__builtins__": {}}) == os.getpid()


def test_reach_os_takes_another_route_than_the_lesson(nb):
    assert nb.reach_os() != ESCAPE


ESCAPE = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__['getpid']()")


def test_load_scores_reads_a_dict_literal(nb):
    assert nb.load_scores("{'ada': 9, 'bob': 7, 'cy': -1}") == {"ada": 9, "bob": 7, "cy": -1}


def test_load_scores_refuses_code_without_running_it(nb):
    for text in (ESCAPE, "{'pid': " + ESCAPE + "}", "__import__('os').getpid()", "(1).__class__", "[1, 2]"):
        with pytest.raises(ValueError):
            nb.load_scores(text)
