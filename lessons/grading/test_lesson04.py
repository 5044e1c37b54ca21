"""Hidden tests for lesson 4 (allowlist_env, denylist_passes), run by ``cellbox grade`` against 04-scrub-the-environment.ipynb."""

import contextlib
import importlib
import os

import pytest

from cellbox.grading.bridge import new, submission_module, value_of

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


@contextlib.contextmanager
def their_environment(**changes):
    """The notebook's process's environment with ``changes`` (None: unset) while the block runs, then as it was."""
    environ = submission_module("os").environ
    saved = {name: environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value


@pytest.fixture
def secret():
    # The notebook's code runs in its own process (cellbox grade): the secret goes into that process's environment.
    with their_environment(ZZ_UNUSUAL_PRIVATE_NAME="secret"):
        yield


def _theirs(value):
    """``value`` made in the notebook's process, so that a change the notebook makes to it shows here."""
    try:
        return new(value)
    except RuntimeError:  # plain pytest: the notebook is imported into this very process
        return value


def _path():
    # The interpreter of the notebook's process, not this test's.
    return os.pathsep.join([os.path.dirname(submission_module("sys").executable), "/usr/bin", "/bin"])


def test_allowlist_env_has_exactly_the_allowlist(nb, secret, tmp_path):
    with their_environment(LANG="C.UTF-8", PATH="/opt/nowhere/bin:/usr/bin:/bin"):
        env = nb.allowlist_env(str(tmp_path))
        assert submission_module("os").environ["PATH"] == "/opt/nowhere/bin:/usr/bin:/bin"
    assert env == {"PATH": _path(), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "LANG": "C.UTF-8"}


def test_allowlist_env_copies_lang_only_when_set(nb, tmp_path):
    with their_environment(LANG=None):
        env = nb.allowlist_env(str(tmp_path))
    assert env == {"PATH": _path(), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}


def test_allowlist_env_adds_extra_names_last(nb, tmp_path):
    with their_environment(LANG=None):
        env = nb.allowlist_env(str(tmp_path), {"A": "1", "B": "2", "PATH": "/custom/bin"})
    assert env == {"PATH": "/custom/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "A": "1", "B": "2"}


def test_allowlist_env_leaves_extra_and_the_notebook_alone(nb, tmp_path):
    extra = _theirs({"COURSE": "py101"})
    environ = submission_module("os").environ
    before = {name: environ[name] for name in environ}
    nb.allowlist_env(str(tmp_path), extra)
    assert value_of(extra) == {"COURSE": "py101"}
    assert {name: environ[name] for name in environ} == before


def test_allowlist_env_child_sees_no_secret(nb, secret, tmp_path):
    code = "import os; print(os.environ.get('ZZ_UNUSUAL_PRIVATE_NAME'), os.path.expanduser('~'))"
    env = nb.allowlist_env(str(tmp_path))
    child = submission_module("subprocess").run([submission_module("sys").executable, "-c", code],
                                                capture_output=True, text=True, env=env)
    assert child.stdout.split() == ["None", str(tmp_path)]


def test_allowlist_env_values_are_strings_for_a_path_home(nb, tmp_path):
    # A Path made in the notebook's own process (only plain data crosses from here).
    home = submission_module("pathlib").Path(str(tmp_path))
    env = nb.allowlist_env(home, {"COURSE": "py101"})
    assert all(isinstance(value, str) for value in env.values())
    assert env["HOME"] == str(tmp_path)


def test_denylist_passes_names_what_the_denylist_keeps(nb):
    assert nb.denylist_passes() == {"PATH", "HOME", "DATABASE_URL", "NPM_AUTH"}
