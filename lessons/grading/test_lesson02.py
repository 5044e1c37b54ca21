"""Hidden tests for lesson 2 (reach_os, load_scores), run by ``cellbox grade`` against 02-in-process-sandboxes-fail.ipynb."""

import importlib

import pytest

from cellbox.grading.bridge import submission_module

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


def _evaluated_elsewhere(expression):
    """Whether ``expression``, evaluated with no builtins in a new process of the notebook's world, is that process's id.

    Never evaluated here: the expression is the submission's, and this process is the trusted side.  A new process
    has a new id, so a pid written out as digits does not pass.
    """
    probe = f"import os, subprocess, warnings; print(eval({expression!r}, {{'__builtins__': {{}}}}) == os.getpid())"
    done = submission_module("subprocess").run([submission_module("sys").executable, "-c", probe],
                                               capture_output=True, text=True, timeout=30)
    return done.stdout.strip() == "True"


def test_reach_os_escapes_an_eval_without_builtins(nb):
    assert _evaluated_elsewhere(nb.reach_os())


def test_reach_os_takes_another_route_than_the_lesson(nb):
    assert "_wrap_close" not in nb.reach_os()


ESCAPE = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__['getpid']()")


def test_load_scores_reads_a_dict_literal(nb):
    assert nb.load_scores("{'ada': 9, 'bob': 7, 'cy': -1}") == {"ada": 9, "bob": 7, "cy": -1}
    assert nb.load_scores('{"ok": True, "note": None}') == {"ok": True, "note": None}
    assert nb.load_scores("{}") == {}


CODE = (ESCAPE, "{'pid': " + ESCAPE + "}", "__import__('os').getpid()", "(1).__class__", "{'a': 9 if True else 0}",
        "{'a': 'x' * 3}", "{'a': ada}")


def test_load_scores_refuses_code_without_running_it(nb):
    for text in CODE:
        with pytest.raises(ValueError):
            nb.load_scores(text)


def test_load_scores_refuses_what_is_not_a_dict_literal(nb):
    for text in ("import os", "{'ada': 9", "[1, 2]", "[('ada', 9)]", "{1, 2}", "'ada'"):
        with pytest.raises(ValueError):
            nb.load_scores(text)
