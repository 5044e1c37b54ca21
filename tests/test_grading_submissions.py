"""Submission forms: folders, zips (and unsafe zips), single files, notebooks, packages; and finding them."""

from __future__ import annotations

import json
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.submissions import (
    ZIP_MAX_RATIO,
    Submission,
    SubmissionError,
    discover,
    lay_out,
    module_name,
    notebook_source,
)
from cellbox.grading.task import GradeSettings, Suite, SuiteError, grade_safely
from cellbox.grading.venvs import BaseLibrary
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import GOOD_FIB, write_suite, write_tree

LIMITS = Limits(wall_time=20, cpu_time=20, memory=1024**3)

# Tests that import the submission by the documented names.
SUBMISSION_TESTS = {
    "test_submission.py": """
        import submission

        def test_fib_through_submission():
            assert submission.fib(10) == 55
    """,
}


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


def grade_file(path: Path, suite: Suite, base: BaseLibrary, limits: Limits = LIMITS):  # type: ignore[no-untyped-def]
    [submission] = [s for s in discover(path.parent) if s.path == str(path.resolve())]
    return grade_safely(submission, suite, GradeSettings(limits=limits), base)


# ---------------------------------------------------------------------- finding submissions


def test_discover_names_each_entry_once_and_ignores_hidden_ones(tmp_path: Path) -> None:
    names = [
        "alice/fib.py",
        "bob.py",
        "carol.ipynb",
        "dave.zip",
        ".hidden/fib.py",
        "__pycache__/x.pyc",
        "notes.txt",
        "erin.py",
        "erin.zip",
    ]
    write_tree(tmp_path, dict.fromkeys(names, GOOD_FIB))
    found = {(s.id, s.kind) for s in discover(tmp_path)}
    assert found == {
        ("alice", "folder"),
        ("bob", "py"),
        ("carol", "ipynb"),
        ("dave", "zip"),
        ("erin.py", "py"),
        ("erin.zip", "zip"),
    }


def test_empty_folder_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SubmissionError, match=r"no submissions found") as info:
        discover(tmp_path)
    assert "\n" not in str(info.value)


def test_module_names_follow_the_documented_rule() -> None:
    assert module_name("01-subprocess.ipynb") == "nb_01_subprocess"
    assert module_name("homework.ipynb") == "homework"
    assert module_name("my lesson (v2).ipynb") == "my_lesson__v2_"
    assert module_name("alice.py") == "alice"


# ---------------------------------------------------------------------- notebooks


def notebook(cells: list[tuple[str, str, list[str]]]) -> str:
    return json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [
                {
                    "cell_type": kind,
                    "source": source,
                    "metadata": {"tags": tags},
                    "outputs": [],
                    "execution_count": None,
                }
                if kind == "code"
                else {"cell_type": kind, "source": source, "metadata": {}}
                for kind, source, tags in cells
            ],
        }
    )


NOTEBOOK = notebook(
    [
        ("markdown", "# Fibonacci\nSome words.", []),
        ("code", "%matplotlib inline\nimport math\n", []),
        ("code", "!pip install requests\nfiles = !ls\nlen?\n", []),
        ("code", GOOD_FIB, []),
        ("code", "1 / 0", ["raises-exception"]),
        ("code", "import time\ntime.sleep(600)", ["skip-grading"]),
        ("code", "%%bash\necho this is shell\n", []),
        ("code", "%%limits wall=1\nwhile True:\n    pass\n", []),
        ("code", "LAST = fib(7)", []),
    ]
)


def test_notebook_source_keeps_code_and_drops_magics_shell_and_tagged_cells() -> None:
    source = notebook_source(NOTEBOOK.encode(), "01-fib.ipynb")
    compile(source, "01-fib", "exec")  # plain Python
    assert "import math" in source and "def fib(n):" in source and "LAST = fib(7)" in source
    for dropped in ("%matplotlib", "!pip", "files = !ls", "len?", "1 / 0", "time.sleep", "echo", "while True"):
        assert dropped not in source, dropped


def test_a_file_that_is_not_a_notebook_is_a_one_line_error() -> None:
    with pytest.raises(SubmissionError, match=r"^broken.ipynb: not a readable notebook"):
        notebook_source(b"{not json", "broken.ipynb")


def test_notebook_is_importable_as_submission_and_by_its_name(tmp_path: Path, base: BaseLibrary) -> None:
    tests = {
        **SUBMISSION_TESTS,
        "test_by_name.py": """
            import nb_01_fib
            import submission

            def test_same_module():
                assert submission is nb_01_fib
                assert nb_01_fib.LAST == 13
        """,
    }
    suite = Suite.find(write_tree(tmp_path / "tests", tests))
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "01-fib.ipynb").write_text(NOTEBOOK)
    result = grade_file(tmp_path / "subs" / "01-fib.ipynb", suite, base)
    assert result.verdict is Verdict.VERIFIED, result.reason


def test_notebook_cells_have_display_and_get_ipython_as_under_a_kernel(tmp_path: Path, base: BaseLibrary) -> None:
    tests = {
        "test_mean.py": """
        import submission

        def test_mean(capsys):
            assert submission.mean([3, 4, 5]) == 4
            assert submission.SHELL_SEEN is True
    """
    }
    suite = Suite.find(write_tree(tmp_path / "tests", tests))
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "mean.ipynb").write_text(
        notebook(
            [
                ("code", "def mean(xs):\n    return sum(xs) / len(xs)\n", []),
                ("code", "display(mean([3, 4, 5]))", []),
                ("code", "SHELL_SEEN = get_ipython() is not None", []),
            ]
        )
    )
    result = grade_file(tmp_path / "subs" / "mean.ipynb", suite, base)
    assert result.verdict is Verdict.VERIFIED, result.reason


def test_single_py_file_is_importable_as_submission(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_tree(tmp_path / "tests", SUBMISSION_TESTS))
    write_tree(tmp_path / "subs", {"alice.py": GOOD_FIB})
    result = grade_file(tmp_path / "subs" / "alice.py", suite, base)
    assert result.verdict is Verdict.VERIFIED, result.reason


# ---------------------------------------------------------------------- zips


def make_zip(path: Path, members: dict[str, str], links: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in members.items():
            archive.writestr(name, text)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return path


def test_zip_with_a_top_folder_is_graded_like_the_folder(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_suite(tmp_path / "tests"))
    (tmp_path / "subs").mkdir()
    archive = make_zip(tmp_path / "subs" / "alice.zip", {"alice/fib.py": GOOD_FIB, "__MACOSX/._fib.py": "junk"})
    result = grade_file(archive, suite, base)
    assert (result.id, result.kind, result.verdict) == ("alice", "zip", Verdict.VERIFIED)


@pytest.mark.parametrize(
    ("members", "links", "reason"),
    [
        ({"../evil.py": "x = 1"}, None, "member '../evil.py' would unpack outside its folder"),
        ({"/etc/evil.py": "x = 1"}, None, "member '/etc/evil.py' would unpack outside its folder"),
        ({"fib.py": GOOD_FIB}, {"tests": "/etc"}, "member 'tests' is a symbolic link; links are not accepted"),
    ],
)
def test_unsafe_zip_is_rejected_with_one_line(
    tmp_path: Path, members: dict[str, str], links: dict[str, str] | None, reason: str
) -> None:
    archive = make_zip(tmp_path / "bad.zip", members, links)
    with pytest.raises(SubmissionError) as info:
        lay_out(Submission(id="bad", path=str(archive), kind="zip"), tmp_path / "out")
    assert str(info.value) == f"bad.zip: {reason}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.py").exists()


def test_zip_bomb_is_stopped_while_unpacking(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        with handle.open("zeros.bin", "w", force_zip64=True) as member:
            for _ in range(64):
                member.write(bytes(1024**2))
    assert archive.stat().st_size * ZIP_MAX_RATIO < 64 * 1024**2
    with pytest.raises(SubmissionError, match=r"^bomb.zip: 'zeros.bin' unpacks too far; is it a zip bomb\?$"):
        lay_out(Submission(id="bomb", path=str(archive), kind="zip"), tmp_path / "out")


def test_unreadable_zip_becomes_an_unverified_row(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_suite(tmp_path / "tests"))
    write_tree(tmp_path / "subs", {"carol.zip": "this is not a zip"})
    result = grade_file(tmp_path / "subs" / "carol.zip", suite, base)
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason == "carol.zip: not a readable zip file (File is not a zip file)"


def test_symlinks_in_a_folder_submission_are_not_followed(tmp_path: Path) -> None:
    write_tree(tmp_path / "alice", {"fib.py": GOOD_FIB})
    (tmp_path / "secret.txt").write_text("hidden tests")
    (tmp_path / "alice" / "peek.txt").symlink_to(tmp_path / "secret.txt")
    layout = lay_out(Submission(id="alice", path=str(tmp_path / "alice"), kind="folder"), tmp_path / "out")
    assert sorted(p.name for p in layout.root.iterdir()) == ["fib.py"]


# ---------------------------------------------------------------------- installs


def test_requirements_that_cannot_install_make_the_submission_unverified(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_suite(tmp_path / "tests"))
    write_tree(
        tmp_path / "subs" / "dave",
        {"fib.py": GOOD_FIB, "requirements.txt": "cellbox-test-absent-dependency\n"},
    )
    result = grade_file(tmp_path / "subs" / "dave", suite, base)
    assert result.verdict is Verdict.UNVERIFIED
    # The grader's side fetches the requirements (see test_grading_offline.py): no wheel of it anywhere.
    assert result.reason.startswith("fetching the requirements ended with status error: ")
    assert "cellbox-test-absent-dependency" in result.reason
    assert result.install is not None and result.install["exit_code"] != 0 and result.install["step"] == "fetch"


@pytest.mark.slow
def test_package_is_installed_in_the_sandbox_and_graded(tmp_path: Path, base: BaseLibrary) -> None:
    # Needs the package index: pip fetches the build backend (setuptools) into an isolated build env.
    suite = Suite.find(write_suite(tmp_path / "tests"))
    write_tree(
        tmp_path / "subs" / "erin",
        {
            "pyproject.toml": """
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "erin-fib"
            version = "1.0"
        """,
            "src/fib/__init__.py": GOOD_FIB,
        },
    )
    result = grade_file(
        tmp_path / "subs" / "erin", suite, base, Limits(wall_time=180, cpu_time=120, memory=2 * 1024**3)
    )
    assert result.verdict is Verdict.VERIFIED, (result.reason, result.install)
    assert result.install is not None and result.install["status"] == "ok"


# ---------------------------------------------------------------------- the instructor suite


def test_suite_lists_the_tests_written_in_its_files(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "test_a.py": "def test_one():\n    pass\ndef helper():\n    pass\nclass TestB:\n    def test_two(self):\n"
            "        pass\n    def other(self):\n        pass\nclass Helper:\n    def test_no(self):\n"
            "        pass\n",
            "sub/b_test.py": "async def test_three():\n    pass\n",
            "data/notes.py": "def test_not_a_test_file():\n    pass\n",
        },
    )
    suite = Suite.find(tmp_path)
    assert suite.files == ("sub/b_test.py", "test_a.py")
    assert set(suite.expected) == {"test_a.py::test_one", "test_a.py::TestB::test_two", "sub/b_test.py::test_three"}


def test_one_test_file_brings_its_conftest(tmp_path: Path) -> None:
    write_tree(
        tmp_path / "tests",
        {
            "test_a.py": "def test_one(answer):\n    assert answer == 42\n",
            "conftest.py": "import pytest\n@pytest.fixture\ndef answer():\n    return 42\n",
            "test_other.py": "def test_other():\n    pass\n",
        },
    )
    suite = Suite.find(tmp_path / "tests" / "test_a.py")
    copied = suite.copy_to(tmp_path / "copy")
    assert sorted(p.name for p in copied.iterdir()) == ["conftest.py", "test_a.py"]
    assert suite.expected == ("test_a.py::test_one",)


def test_a_test_file_that_does_not_parse_is_a_one_line_error(tmp_path: Path) -> None:
    write_tree(tmp_path, {"test_a.py": "def test_one(:\n"})
    with pytest.raises(
        SuiteError, match=r": the tests do not collect: test_a.py: SyntaxError: invalid syntax$"
    ) as info:
        Suite.find(tmp_path)
    assert "\n" not in str(info.value)
