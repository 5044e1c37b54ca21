"""Grade one submission: a task directory, a fresh venv, the install, the tests, the verdict.

Steps (each submission, in its own :class:`~cellbox.environment.TaskDirectory`,
removed afterwards whatever happens):

1. lay the submission out in ``work/submission`` (:func:`~cellbox.grading.submissions.lay_out`);
2. make a virtualenv without pip in ``venv/``;
3. when it has a package or a ``requirements.txt``: ``pip install`` it, in the
   sandbox, under the grading limits and isolation (plus the network);
4. then copy what the grader controls into a grader directory *beside* the
   task directory (the child may write anywhere in its task directory):
   ``tests`` (the instructor tests), ``pytest.ini`` and, unless the test run
   cannot write the grading run's one base library
   (:func:`base_library_is_read_only`), ``lib`` (pytest and the reporter); an
   isolated test run sees these read-only;
5. run pytest in the sandbox with that configuration only (``-c`` the grader's
   ini, ``--rootdir`` and ``--confcutdir`` at the tests, the cache plugin
   off, plugin autoloading off, the reporter loaded with ``-p``), the
   submission folder as working directory and on ``sys.path``, and the run's
   nonce on stdin;
6. judge the run (:func:`cellbox.verdict.judge`) from pytest's exit status,
   the reporter's evidence and the sandbox's Outcome.

The grader never imports submission code: it only copies files, unpacks zips
and reads notebook JSON.  A submission's ``conftest.py``, ``pytest.ini``,
``pyproject.toml``, ``setup.cfg`` and ``tox.ini`` are not read by pytest: the
tests' folder is not below the submission, the ini is given with ``-c``, and
conftest files are looked for only from the tests' folder down.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..environment import TaskDirectory
from ..isolation import Isolation, make_plan, probe
from ..limits import Limits
from ..outcome import Outcome, Status
from ..sandbox import Run, resolve_user, start
from ..verdict import Verdict, judge
from .evidence import EvidenceRecorder
from .results import SubmissionResult
from .submissions import Layout, Submission, SubmissionError, lay_out
from .venvs import REPORTER_MODULE, BaseLibrary, create_venv, pip_install_command, readable_by_all

__all__ = [
    "Suite",
    "SuiteError",
    "GradeSettings",
    "grade_submission",
    "grade_safely",
    "expected_tests",
    "file_digests",
    "PYTEST_INI",
    "GRADE_ISOLATION",
    "StopSwitch",
]

# The whole pytest configuration of a test run.  Written by the grader; the
# submission's own files are never an ancestor of the tests, so none is found.
PYTEST_INI = """\
# Written by cellbox grade: the only pytest configuration of this test run.
[pytest]
python_files = test_*.py *_test.py
python_classes = Test*
python_functions = test*
addopts =
"""

# Submissions are hostile: every isolation layer this machine has, by default
# (the ones it lacks are named in each run's notes; see `cellbox doctor`).
GRADE_ISOLATION = Isolation(mode="auto")

# Run by the task's interpreter with -I (no PYTHONPATH, no user site, no script
# directory on sys.path): the grader's library first, then the submission.
# -I also ignores PYTHONDONTWRITEBYTECODE and PYTHONUNBUFFERED, hence -B and -u:
# nothing may write bytecode into the instructor's folder.
BOOT = "import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; import pytest; raise SystemExit(pytest.main())"
TEST_PATTERNS = ("test_*.py", "*_test.py")
_IGNORED_DIRS = ("__pycache__", ".pytest_cache", ".git")


class SuiteError(ValueError):
    """The instructor tests cannot be used (not found, none in the folder, a syntax error)."""


def expected_tests(root: Path, files: tuple[str, ...]) -> tuple[str, ...]:
    """The tests written in ``files``, read with :mod:`ast` (never run): ``file::name``, ``file::Class::name``.

    Top-level functions named ``test*`` and methods named ``test*`` of
    top-level classes named ``Test*`` (the grader's ``python_functions`` and
    ``python_classes``).  A run is verified only when it collected each of
    them and nothing else, which catches a submission that deselects, rewrites
    or adds tests.  Tests made at run time (a loop over ``globals()``, methods
    inherited from a base class in another file) are not seen here; write
    instructor tests as plain functions or methods.

    Raises:
        SuiteError: a test file cannot be read or parsed.
    """
    found = []
    for name in files:
        try:
            tree = ast.parse((root / name).read_bytes(), filename=name)
        except (OSError, SyntaxError, ValueError) as exc:
            raise SuiteError(f"{root / name}: cannot be read as Python ({exc})") from None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                found.append(f"{name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                found.extend(
                    f"{name}::{node.name}::{item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")
                )
    return tuple(found)


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every entry under ``root``, by relative path; links and special files are marked, not followed.

    Taken before and after a test run: any difference (a file changed, added
    or removed, a bytecode cache planted) makes the run's record untrustworthy.
    """
    digests = {}
    for folder, dirs, names in os.walk(root):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = Path(folder) / name
            key = path.relative_to(root).as_posix()
            if path.is_symlink() or not path.is_file():
                digests[key] = "not a regular file"
            else:
                digests[key] = _digest(path)
    return digests


@dataclasses.dataclass(frozen=True)
class Suite:
    """The instructor tests.

    Attributes:
        root: the folder copied into each task as ``grader/tests``.
        files: test files relative to ``root`` (POSIX form).
        expected: the tests written in them (:func:`expected_tests`).
        only: when ``--tests`` named one file: the files copied (it and a
            ``conftest.py`` beside it); ``None`` copies the whole folder.
    """

    root: Path
    files: tuple[str, ...]
    expected: tuple[str, ...]
    only: tuple[str, ...] | None = None

    @classmethod
    def find(cls, path: str | os.PathLike[str]) -> Suite:
        """The suite at ``path``: a folder of tests, or one test file.

        Raises:
            SuiteError: nothing there, no ``test_*.py`` / ``*_test.py`` file, no
                test in them, or a file that does not parse.
        """
        given = Path(path).resolve()
        if given.is_file() and given.suffix == ".py":
            only = tuple(name for name in (given.name, "conftest.py") if (given.parent / name).is_file())
            return cls._checked(given.parent, (given.name,), only, path)
        if not given.is_dir():
            raise SuiteError(f"{path}: no such tests folder or test file")
        found = {
            item.relative_to(given).as_posix()
            for pattern in TEST_PATTERNS
            for item in given.rglob(pattern)
            if item.is_file() and not set(item.relative_to(given).parts) & set(_IGNORED_DIRS)
        }
        if not found:
            raise SuiteError(f"{path}: no tests found (files named test_*.py or *_test.py)")
        return cls._checked(given, tuple(sorted(found)), None, path)

    @classmethod
    def _checked(cls, root: Path, files: tuple[str, ...], only: tuple[str, ...] | None, given: object) -> Suite:
        expected = expected_tests(root, files)
        if not expected:
            raise SuiteError(f"{given}: no tests found (functions named test* in {', '.join(files)})")
        return cls(root=root, files=files, expected=expected, only=only)

    def copy_to(self, dest: Path) -> Path:
        """Copy the tests into ``dest`` (a new folder) and return it."""
        if self.only is not None:
            dest.mkdir(parents=True)
            for name in self.only:
                shutil.copyfile(self.root / name, dest / name)
        else:
            shutil.copytree(self.root, dest, symlinks=False, ignore=shutil.ignore_patterns(*_IGNORED_DIRS))
        return dest

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "files": list(self.files),
            "expected": list(self.expected),
            "only": list(self.only) if self.only else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Suite:
        only = data.get("only")
        return cls(
            root=Path(data["root"]),
            files=tuple(data["files"]),
            expected=tuple(data["expected"]),
            only=tuple(only) if only else None,
        )


@dataclasses.dataclass(frozen=True)
class GradeSettings:
    """How every submission of a grading run is graded.

    Attributes:
        limits: the sandbox limits of the install and of the test run (each).
        find_links: a folder or URL of wheels pip may install from (``--find-links``).
        task_root: the folder task directories are made in (default: the system temp folder).
        isolation: the namespace layers of both runs (:class:`~cellbox.isolation.Isolation`);
            the install also gets the network (pip needs the index), the test run
            sees the grader's files read-only.
    """

    limits: Limits = Limits()
    find_links: str | None = None
    task_root: str | None = None
    isolation: Isolation = GRADE_ISOLATION

    def to_json(self) -> dict[str, Any]:
        return {
            "limits": self.limits.as_dict(),
            "find_links": self.find_links,
            "task_root": self.task_root,
            "isolation": dataclasses.asdict(self.isolation),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradeSettings:
        return cls(
            limits=Limits(**data["limits"]),
            find_links=data.get("find_links"),
            task_root=data.get("task_root"),
            isolation=Isolation.from_options(**data["isolation"]),
        )

    def child_owner(self) -> tuple[int, int] | None:
        """``(uid, gid)`` the children will run as when that is not this process's user, else ``None``.

        With the ``user`` isolation layer, a grader running as root runs its
        children as ``nobody`` (:mod:`cellbox.isolation`): the submission's
        folder and its venv are given to that user so pip and the tests can write there.
        """
        if not self.isolation.wanted:
            return None
        plan = make_plan(self.isolation, probe(), user=None)
        if plan.user is None:
            return None
        uid, gid, _groups, _name = resolve_user(plan.user)
        return None if uid == os.geteuid() else (uid, gid)


def _venv_env(venv: Path) -> dict[str, str]:
    return {
        "PATH": os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "VIRTUAL_ENV": str(venv),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PIP_NO_INPUT": "1",
    }


def _last_line(outcome: Outcome) -> str:
    lines = [line.strip() for line in (outcome.stderr + "\n" + outcome.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1][:300]


def _install(layout: Layout, python: Path, space: _Workspace, settings: GradeSettings) -> Outcome:
    command = pip_install_command(
        python, package=layout.package, requirements=layout.requirements, find_links=settings.find_links
    )
    # pip needs the package index; what it builds and installs stays in the task directory.
    isolation = dataclasses.replace(settings.isolation, network=True)
    return space.run(command, limits=settings.limits, cwd=layout.root, env=_venv_env(python.parent.parent),
                     isolation=isolation)


def _pytest_argv(python: Path, lib: Path, layout: Layout, grader: Path) -> list[str]:
    tests = grader / "tests"
    return [
        str(python),
        "-I",
        "-B",
        "-u",
        "-c",
        BOOT,
        str(lib),
        str(layout.root),
        "-c",
        str(grader / "pytest.ini"),
        f"--rootdir={tests}",
        f"--confcutdir={tests}",
        "-p",
        "no:cacheprovider",
        "-p",
        REPORTER_MODULE,
        "--color=no",
        "--code-highlight=no",
        "--tb=short",
        "-q",
        str(tests),
    ]


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _result(submission: Submission, verdict: Verdict, reason: str, **fields: Any) -> SubmissionResult:
    return SubmissionResult(
        id=submission.id, path=submission.path, kind=submission.kind, verdict=verdict, reason=reason, **fields
    )


class StopSwitch:
    """Stops every sandboxed run started through it, at once (Ctrl-C while grading).

    Thread-safe: :meth:`run` is called from the grading threads, :meth:`stop`
    from the thread that caught the interrupt.  A run started after
    :meth:`stop` is killed as soon as it starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[Run] = set()
        self.stopped = False

    def run(self, argv: list[str], **options: Any) -> Outcome:
        """Like :func:`cellbox.sandbox.run`, but stoppable by :meth:`stop`."""
        started = start(argv, **options)
        with self._lock:
            self._runs.add(started)
            stopped = self.stopped
        if stopped:
            started.kill()
        try:
            return started.wait()
        finally:
            with self._lock:
                self._runs.discard(started)

    def stop(self) -> None:
        """Kill every run in progress (their status becomes ``interrupted``)."""
        with self._lock:
            self.stopped = True
            runs = list(self._runs)
        for each in runs:
            each.kill()


@dataclasses.dataclass
class _Workspace:
    """One submission's directories: the task directory (the child's) and the grader's, beside it.

    The grader's directory (pytest, the reporter, the tests, the ini) is not
    inside the task directory, which the child may write everywhere; under
    isolation it is shown to the test run read-only (bubblewrap bind, Landlock).
    """

    task: TaskDirectory
    grader: Path
    owner: tuple[int, int] | None
    switch: StopSwitch

    @classmethod
    def create(cls, settings: GradeSettings, switch: StopSwitch | None = None) -> _Workspace:
        owner = settings.child_owner()
        task = TaskDirectory.create(settings.task_root, prefix="cellbox-grade-")
        try:
            grader = Path(tempfile.mkdtemp(prefix=f"{task.path.name}-grader-", dir=settings.task_root))
        except BaseException:
            task.remove()
            raise
        return cls(task=task, grader=grader, owner=owner, switch=switch or StopSwitch())

    def run(self, argv: list[str], **options: Any) -> Outcome:
        """Run ``argv`` in the sandbox with this task directory (stoppable by the grading run's switch)."""
        return self.switch.run(argv, task=self.task, **options)

    def give(self, path: Path) -> None:
        """Hand ``path`` and everything below it to the children's user (when that is another user)."""
        if self.owner is None:
            return
        for folder, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.chown(os.path.join(folder, name), *self.owner, follow_symlinks=False)
        os.chown(path, *self.owner)

    def open_grader(self) -> None:
        """Let every user read the grader's directory (a+rX); nobody but the grader may write it."""
        readable_by_all(self.grader)

    def remove(self) -> None:
        self.task.remove()
        shutil.rmtree(self.grader, ignore_errors=True)


def base_library_is_read_only(isolation: Isolation) -> bool:
    """Whether test runs under ``isolation`` cannot write the base library, so all may share the one copy.

    True only when the plan (:func:`~cellbox.isolation.make_plan`) runs the
    children as another user than this process (root plus the ``user`` layer:
    ``nobody``), to whom the library is 0644 files in 0755 folders owned by the
    grader (see :class:`~cellbox.grading.venvs.BaseLibrary`).  A read-only view
    alone is not enough: without the ``user`` layer a root child keeps its
    capabilities and can remount the bind read-write (``mount -o remount,rw``).
    Otherwise each task gets its own copy: a submission could change a shared
    one for the submissions graded with it and after it.
    """
    plan = make_plan(isolation, probe(), user=None)
    return plan.user is not None and resolve_user(plan.user)[0] != os.geteuid()


def _grader_files(space: _Workspace, suite: Suite, base: BaseLibrary, shared: bool) -> Path:
    """Copy in ``tests`` and ``pytest.ini``, and ``lib`` (pytest and the reporter) unless ``shared``; return the lib."""
    lib = base.shared() if shared else base.copy_to(space.grader / "lib")
    suite.copy_to(space.grader / "tests")
    (space.grader / "pytest.ini").write_text(PYTEST_INI)
    space.open_grader()
    return lib


def _instructor_digests(grader: Path) -> dict[str, str]:
    return file_digests(grader / "tests") | {"../pytest.ini": _digest(grader / "pytest.ini")}


def _run_tests(
    space: _Workspace, layout: Layout, python: Path, suite: Suite, settings: GradeSettings, base: BaseLibrary
) -> tuple[EvidenceRecorder, Outcome]:
    """Run the instructor tests in the sandbox; return what the reporter said and how the run ended."""
    shared = base_library_is_read_only(settings.isolation)
    lib = _grader_files(space, suite, base, shared)
    before = _instructor_digests(space.grader)
    nonce = secrets.token_hex(16)
    recorder = EvidenceRecorder(nonce, suite.expected)
    read_only = (*settings.isolation.read_only, str(space.grader), *([str(lib)] if shared else []))
    isolation = dataclasses.replace(settings.isolation, read_only=read_only)
    outcome = space.run(
        _pytest_argv(python, lib, layout, space.grader),
        limits=settings.limits,
        cwd=layout.root,
        env=_venv_env(python.parent.parent),
        stdin=nonce + "\n",
        channel=True,
        on_message=recorder.feed,
        isolation=isolation,
    )
    recorder.check_files(before, _instructor_digests(space.grader))
    return recorder, outcome


def _grade_in(
    space: _Workspace, submission: Submission, suite: Suite, settings: GradeSettings, base: BaseLibrary
) -> SubmissionResult:
    layout = lay_out(submission, space.task.work / "submission")
    python = create_venv(space.task.path / "venv")
    space.give(layout.root)
    space.give(space.task.path / "venv")
    install = None
    if layout.package or layout.requirements:
        install = _install(layout, python, space, settings)
        if install.status is not Status.OK:
            verdict = Verdict.TIMED_OUT if install.status is Status.TIMED_OUT else Verdict.UNVERIFIED
            reason = f"install ended with status {install.status.value}: {_last_line(install)}"
            return _result(submission, verdict, reason, install=install.to_json())
    recorder, outcome = _run_tests(space, layout, python, suite, settings, base)
    judgement = judge(outcome.exit_code, recorder.evidence(), outcome)
    return _result(
        submission,
        judgement.verdict,
        judgement.reason,
        tests=recorder.tests(),
        running=recorder.running,
        install=install.to_json() if install else None,
        run=outcome.to_json(),
    )


def grade_submission(
    submission: Submission,
    suite: Suite,
    settings: GradeSettings,
    base: BaseLibrary,
    switch: StopSwitch | None = None,
) -> SubmissionResult:
    """Grade one submission in a new task directory, removed before returning.

    A submission that cannot be laid out (an unsafe zip, a bad notebook) is
    ``unverified`` with the one-line reason.  ``switch`` lets another thread
    stop its runs (see :class:`StopSwitch`).

    Raises:
        OSError, SandboxError: the grader itself failed (see :func:`grade_safely`).
    """
    started = time.monotonic()
    space = _Workspace.create(settings, switch)
    try:
        result = _grade_in(space, submission, suite, settings, base)
    except SubmissionError as exc:
        result = _result(submission, Verdict.UNVERIFIED, str(exc))
    finally:
        space.remove()
    result.duration = time.monotonic() - started
    return result


def grade_safely(
    submission: Submission,
    suite: Suite,
    settings: GradeSettings,
    base: BaseLibrary,
    switch: StopSwitch | None = None,
) -> SubmissionResult:
    """:func:`grade_submission`, with any failure of the grader's own code made that submission's row.

    Whatever happens, the submission gets exactly one result: ``unverified``
    with ``grader error: ...`` as the reason when the grader itself failed.
    """
    started = time.monotonic()
    try:
        return grade_submission(submission, suite, settings, base, switch)
    except Exception as exc:  # noqa: BLE001 - one submission's failure must not stop the others
        first = str(exc).splitlines()[0] if str(exc) else ""
        return _result(
            submission,
            Verdict.UNVERIFIED,
            f"grader error: {type(exc).__name__}: {first}",
            duration=time.monotonic() - started,
        )
