"""Hidden tests for lesson 4 (allowlist_env, denylist_passes), run by ``cellbox grade`` against 04-scrub-the-environment.ipynb."""

import importlib
import os
import subprocess
import sys

import pytest

from cellbox.grading.bridge import submission_module

NOTEBOOK, MODULE = "04-scrub-the-environment.ipynb", "nb_04_scrub_the_environment"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


@pytest.fixture
def secret():
    # The notebook's code runs in its own process (cellbox grade): the secret goes into that process's environment.
    environ = submission_module("os").environ
    environ["ZZ_UNUSUAL_PRIVATE_NAME"] = "secret"
    yield
    del environ["ZZ_UNUSUAL_PRIVATE_NAME"]


def test_allowlist_env_drops_every_other_name(nb, secret, tmp_path):
    env = nb.allowlist_env(str(tmp_path))
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG"}
    assert "ZZ_UNUSUAL_PRIVATE_NAME" not in env


def test_allowlist_env_home_and_path(nb, tmp_path):
    env = nb.allowlist_env(str(tmp_path))
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    # The interpreter of the notebook's process, not this test's.
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(submission_module("sys").executable)


def test_allowlist_env_adds_extra_names(nb, tmp_path):
    env = nb.allowlist_env(str(tmp_path), {"A": "1", "B": "2"})
    assert env["A"] == "1" and env["B"] == "2"


def test_allowlist_env_child_sees_no_secret(nb, secret, monkeypatch, tmp_path):
    monkeypatch.setenv("ZZ_UNUSUAL_PRIVATE_NAME", "secret")
    code = "import os; print(os.environ.get('ZZ_UNUSUAL_PRIVATE_NAME'), os.path.expanduser('~'))"
    env = nb.allowlist_env(str(tmp_path))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert child.stdout.split() == ["None", str(tmp_path)]


def test_allowlist_env_values_are_strings_for_a_path_home(nb, tmp_path):
    # A Path made in the notebook's own process (only plain data crosses from here).
    home = submission_module("pathlib").Path(str(tmp_path))
    env = nb.allowlist_env(home, {"COURSE": "py101"})
    assert all(isinstance(value, str) for value in env.values())
    assert env["HOME"] == str(tmp_path)


def test_denylist_passes_names_what_the_denylist_keeps(nb):
    assert nb.denylist_passes() == {"PATH", "HOME", "DATABASE_URL", "NPM_AUTH"}
