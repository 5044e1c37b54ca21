"""Hidden tests for lesson 13 (limit_hit, limits_line, what_next),
run by ``cellbox grade`` against 13-the-cellbox-kernel.ipynb."""

import importlib

import pytest

NOTEBOOK, MODULE = "13-the-cellbox-kernel.ipynb", "nb_13_the_cellbox_kernel"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



def _outcome(status, **limits):
    base = {"wall_time": 30.0, "cpu_time": 30.0, "memory": 2 * 1024**3, "output": 1024**2}
    base.update(limits)
    return {"status": status, "exit_code": None, "signal": None, "limits": base}


def test_limit_hit_names_the_field(nb):
    assert nb.limit_hit(_outcome("timed_out")) == "wall_time"
    assert nb.limit_hit(_outcome("cpu_limit")) == "cpu_time"
    assert nb.limit_hit(_outcome("memory_limit")) == "memory"
    assert nb.limit_hit(_outcome("output_limit")) == "output"


def test_limit_hit_none_without_a_limit(nb):
    for status in ("ok", "error", "crashed", "interrupted"):
        assert nb.limit_hit(_outcome(status)) is None


def test_limits_line_doubles_the_limit(nb):
    assert nb.limits_line(_outcome("timed_out", wall_time=5.0)) == "%%limits wall=10"
    assert nb.limits_line(_outcome("timed_out", wall_time=2.5)) == "%%limits wall=5"
    assert nb.limits_line(_outcome("timed_out", wall_time=0.75)) == "%%limits wall=1.5"
    assert nb.limits_line(_outcome("cpu_limit", cpu_time=3.0)) == "%%limits cpu=6"
    assert nb.limits_line(_outcome("cpu_limit", cpu_time=0.2)) == "%%limits cpu=0.4"
    assert nb.limits_line(_outcome("timed_out", wall_time=0.25)) == "%%limits wall=0.5"
    assert nb.limits_line(_outcome("memory_limit", memory=128 * 1024**2)) == "%%limits memory=256M"
    assert nb.limits_line(_outcome("output_limit", output=100 * 1024)) == "%%limits output=200K"


def test_limits_line_none_without_a_limit(nb):
    assert nb.limits_line(_outcome("ok")) is None
    assert nb.limits_line(_outcome("crashed")) is None


def test_what_next_first_line_no_threads_fix_the_loop(nb):
    assert nb.what_next() == {"second_line": "b", "thread": "b", "stopped": "b"}
