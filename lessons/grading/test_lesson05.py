"""Hidden tests for lesson 5 (run_limited), run by ``cellbox grade`` against 05-resource-limits.ipynb."""

import importlib

import pytest

NOTEBOOK, MODULE = "05-resource-limits.ipynb", "nb_05_resource_limits"
MB = 1024 * 1024


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def test_run_limited_ok(nb):
    assert nb.run_limited("print(sum(range(10)))", 256 * MB, 5) == "ok"


def test_run_limited_error(nb):
    assert nb.run_limited("import sys; sys.exit(2)", 256 * MB, 5) == "error"


def test_run_limited_memory(nb):
    assert nb.run_limited("x = [bytearray(64 * 1024 * 1024) for _ in range(8)]", 200 * MB, 5) == "memory_limit"


def test_run_limited_cpu(nb):
    assert nb.run_limited("while True: pass", 256 * MB, 1) == "cpu_limit"
