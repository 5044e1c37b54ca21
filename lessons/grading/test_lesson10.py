"""Hidden tests for lesson 10 (fresh_venv, runs_project_code), run by ``cellbox grade`` against 10-a-fresh-virtualenv-per-task.ipynb."""

import importlib
import os
import subprocess

import pytest

NOTEBOOK, MODULE = "10-a-fresh-virtualenv-per-task.ipynb", "nb_10_a_fresh_virtualenv_per_task"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")



def test_fresh_venv_python_runs_in_the_new_prefix(nb, tmp_path):
    where = tmp_path / "env"
    python = nb.fresh_venv(str(where))
    said = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=60)
    assert os.path.realpath(said.stdout.strip()) == os.path.realpath(where)


def test_fresh_venv_sees_no_outside_packages(nb, tmp_path):
    python = nb.fresh_venv(str(tmp_path / "env"))
    code = "import importlib.util; print(importlib.util.find_spec('pytest') is None)"
    assert subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip() == "True"


def test_fresh_venv_two_tasks_are_separate(nb, tmp_path):
    first = nb.fresh_venv(str(tmp_path / "a"))
    second = nb.fresh_venv(str(tmp_path / "b"))
    assert first != second
    site = subprocess.run([first, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    with open(os.path.join(site, "leftover.py"), "w") as f:
        f.write("X = 1\n")
    code = "import importlib.util; print(importlib.util.find_spec('leftover') is None)"
    assert subprocess.run([second, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip() == "True"


def test_runs_project_code(nb):
    assert nb.runs_project_code() == {"d", "e", "f"}


def test_fresh_venv_does_not_include_system_site_packages(nb, tmp_path):
    nb.fresh_venv(str(tmp_path / "env"))
    config = (tmp_path / "env" / "pyvenv.cfg").read_text().replace(" ", "").lower()
    assert "include-system-site-packages=true" not in config
