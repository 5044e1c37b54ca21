"""Hidden tests for lesson 8 (launcher_command, unsafe_with_threads), run by ``cellbox grade`` against 08-threads-and-preexec-fn.ipynb."""

import importlib
import subprocess
import sys

import pytest

from cellbox.grading.bridge import submission_module

NOTEBOOK, MODULE = "08-threads-and-preexec-fn.ipynb", "nb_08_threads_and_preexec_fn"
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



def test_launcher_command_runs_the_command(nb):
    command = nb.launcher_command(["sh", "-c", "echo $0-ok"], 256 * MB, 5)
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.stdout == "sh-ok\n"


def test_launcher_command_keeps_every_word_of_argv(nb):
    command = nb.launcher_command(["echo", "it's", "two  words", '"quoted"'], 256 * MB, 5)
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.stdout == "it's two  words \"quoted\"\n"


@pytest.mark.parametrize("memory, cpu", [(300 * MB, 7), (222 * MB, 2)])
def test_launcher_command_sets_the_limits(nb, memory, cpu):
    # Soft and hard RLIMIT_AS both, or the command could raise its own limit again.
    probe = "import resource as r; print(*r.getrlimit(r.RLIMIT_AS), *r.getrlimit(r.RLIMIT_CPU))"
    command = nb.launcher_command([sys.executable, "-c", probe], memory, cpu)
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.stdout.split() == [str(memory), str(memory), str(cpu), str(cpu + 1)]


def test_launcher_command_leaves_the_notebooks_own_limits(nb):
    resource = submission_module("resource")
    before = [tuple(resource.getrlimit(which)) for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU)]
    nb.launcher_command(["true"], 256 * MB, 5)
    assert [tuple(resource.getrlimit(which)) for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU)] == before


def test_launcher_command_execs_in_the_same_process(nb):
    proc = subprocess.Popen(nb.launcher_command([sys.executable, "-c", "import os; print(os.getpid())"], 256 * MB, 5),
                            stdout=subprocess.PIPE, text=True)
    assert int(proc.communicate(timeout=30)[0]) == proc.pid


def test_launcher_command_memory_limit_holds(nb):
    command = nb.launcher_command([sys.executable, "-c", "x = bytearray(500 * 1024 * 1024)"], 200 * MB, 5)
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.stderr.strip().splitlines()[-1].startswith("MemoryError")


def test_unsafe_with_threads(nb):
    assert nb.unsafe_with_threads() == {"a", "f"}
