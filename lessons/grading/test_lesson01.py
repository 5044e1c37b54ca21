"""Hidden tests for lesson 1 (run_isolated, predict), run by ``cellbox grade`` against 01-separate-process.ipynb."""

import importlib
import os

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


def test_run_isolated_any_nonzero_status_is_failure_even_with_stderr_empty(nb):
    # SystemExit, not os._exit: code run in this process (exec) then fails the test instead of ending pytest.
    for status in (1, 2, 3, 4, 5):
        assert nb.run_isolated(f"raise SystemExit({status})") == (False, "", ""), f"exit status {status}"


def test_run_isolated_a_signal_is_failure(nb):
    _, out, _ = nb.run_isolated("import os; print(os.getpid())")
    assert out.strip() != str(os.getpid()), "the code ran in this process: the signal below would end it"
    ok, _, _ = nb.run_isolated("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert ok is False


def test_run_isolated_a_warning_on_stderr_is_no_failure(nb):
    assert nb.run_isolated("import sys; sys.stderr.write('careful\\n')") == (True, "", "careful\n")


def test_run_isolated_returns_the_output_untouched(nb):
    code = "import sys; print('  out  '); sys.stderr.write('  err  \\n\\n')"
    assert nb.run_isolated(code) == (True, "  out  \n", "  err  \n\n")


def test_run_isolated_keeps_changes_in_the_child(nb):
    # A harmless change: code run in this process (exec) would show it here, without breaking pytest.
    import builtins

    ok, _, _ = nb.run_isolated("import builtins; builtins.lesson01_was_here = True")
    try:
        assert ok is True
        assert not hasattr(builtins, "lesson01_was_here")
    finally:
        vars(builtins).pop("lesson01_was_here", None)


def test_run_isolated_passes_quotes_and_dollars_untouched(nb):
    # A shell command string (shell=True, -c '...') mangles both.
    assert nb.run_isolated("print('it' + \"'s\", \"$HOME\")") == (True, "it's $HOME\n", "")


def test_run_isolated_runs_in_another_process(nb):
    ok, out, _ = nb.run_isolated("import os; print(os.getpid())")
    assert ok is True and out.strip().isdigit() and int(out) != os.getpid()


SNIPPETS = {
    "a": (True, "one\ntwo\n"),
    "b": (False, "start\n"),
    "c": (True, ""),
    "d": (True, "bye\n"),
    "e": (False, ""),
}


def test_predict_matches_what_the_children_do(nb):
    assert set(nb.SNIPPETS) == set(SNIPPETS)
    assert nb.predict() == SNIPPETS
