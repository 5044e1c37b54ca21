"""Hidden tests for lesson 5 (run_limited, predict_limits), run by ``cellbox grade`` against 05-resource-limits.ipynb."""

import importlib

import pytest

from cellbox.grading.bridge import submission_module

NOTEBOOK, MODULE = "05-resource-limits.ipynb", "nb_05_resource_limits"
MB = 1024 * 1024
_CALLER = {}


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


def _limits():
    # The notebook's own limits, as its process has them (under cellbox grade it is not this process).
    resource = submission_module("resource")
    return resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)


def _run(nb, *args):
    # A run_limited that limited its caller (setrlimit in the notebook) must fail here, not leave pytest itself
    # under a 1 s CPU limit for the tests below (that would end the run, an unverified verdict, not failed).
    if _CALLER.get("limited"):
        pytest.fail("run_limited set the limits on its caller: setrlimit belongs in the child")
    return nb.run_limited(*args)


def test_run_limited_leaves_the_caller_alone(nb):
    before = _limits()
    nb.run_limited("pass", 300 * MB, 30)
    _CALLER["limited"] = _limits() != before
    assert not _CALLER["limited"], "run_limited set the limits on its caller: setrlimit belongs in the child"


def test_run_limited_ok(nb):
    assert _run(nb, "print(sum(range(10)))", 256 * MB, 5) == "ok"


def test_run_limited_error(nb):
    assert _run(nb, "import sys; sys.exit(2)", 256 * MB, 5) == "error"


def test_run_limited_hard_cpu_limit_one_above(nb):
    code = "import resource, sys; s, h = resource.getrlimit(resource.RLIMIT_CPU); sys.exit(0 if (s, h) == (4, 5) else 3)"
    assert _run(nb, code, 256 * MB, 4) == "ok"


def test_run_limited_memory_is_rlimit_as(nb):
    code = ("import resource, sys; sys.exit(0 if resource.getrlimit(resource.RLIMIT_AS) == "
            f"({256 * MB}, {256 * MB}) else 3)")
    assert _run(nb, code, 256 * MB, 4) == "ok"


def test_run_limited_memory(nb):
    assert _run(nb, "x = [bytearray(64 * 1024 * 1024) for _ in range(8)]", 200 * MB, 5) == "memory_limit"


def test_run_limited_cpu(nb):
    # The child stops by itself after 2 s of CPU: an answer without a CPU limit says "ok" then, instead of hanging.
    spin = "import time\nend = time.process_time() + 2\nwhile time.process_time() < end: pass"
    assert _run(nb, spin, 256 * MB, 1) == "cpu_limit"


def test_run_limited_cpu_when_the_child_ignores_sigxcpu(nb):
    # What the kernel sends at the hard limit to a child that ignores SIGXCPU (and at the soft one), sent by the
    # child to itself: how they are read, without spending the CPU seconds.
    for name in ("SIGKILL", "SIGXCPU"):
        assert _run(nb, f"import os, signal; os.kill(os.getpid(), signal.{name})", 256 * MB, 1) == "cpu_limit", name


def test_run_limited_other_signals_and_statuses_are_errors(nb):
    for name in ("SIGSEGV", "SIGTERM"):
        code = f"import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); os.kill(os.getpid(), signal.{name})"
        assert _run(nb, code, 256 * MB, 5) == "error", name
    for status in (1, 2, 3, 4, 5):
        assert _run(nb, f"import os; os._exit({status})", 256 * MB, 5) == "error", status
    assert _run(nb, "import sys; sys.exit('no MemoryError here')", 256 * MB, 5) == "error"


def test_predict_limits(nb):
    assert nb.predict_limits() == {
        "a": "ok", "b": "memory_limit", "c": "ok", "d": "cpu_limit", "e": "memory_limit", "f": "ok",
    }
