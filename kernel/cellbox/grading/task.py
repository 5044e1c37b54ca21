"""Grade one submission: a task directory, a fresh venv, the install, the tests, the verdict.

Steps (each submission, in its own :class:`~cellbox.sandbox.environment.TaskDirectory`,
removed afterwards whatever happens):

1. lay the submission out in ``work/submission`` (:func:`~cellbox.grading.submissions.lay_out`);
2. make a virtualenv without pip in ``venv/``;
3. when it has a package or a ``requirements.txt``: the grader's side fetches
   the wheels it declares (:mod:`cellbox.grading.wheelhouse`, with the
   network, nothing of the submission run), then ``pip install --no-index``
   installs it from them, in the sandbox, under the grading limits and
   isolation, with the network off and the grader's site directories out of
   view (:func:`~cellbox.grading.venvs.grader_site_hidden`);
4. copy the worker library (:class:`~cellbox.grading.venvs.BaseLibrary`) into
   the task directory, and the instructor tests and ``pytest.ini`` into a
   grader directory *beside* it (never inside: the submission may write
   anywhere in its task directory);
5. run the trusted test process (:mod:`cellbox.grading.trusted`) through the
   sandbox, as the grader's user, with the grader's Python: pytest with that
   configuration only (``-c`` the grader's ini, ``--rootdir`` and
   ``--confcutdir`` at the tests, the cache plugin off, plugin autoloading
   off, the reporter loaded with ``-p``) and the run's nonce on stdin.  It
   starts the submission's own sandboxed process (the grading limits and
   isolation) and reaches it only through plain data
   (:mod:`cellbox.grading.bridge`);
6. judge the run (:func:`cellbox.verdict.judge`) from pytest's exit status,
   the reporter's evidence and the sandbox's Outcome.

Neither the grader nor the trusted test process imports submission code: the
grader copies files, unpacks zips and reads notebook JSON; the test process
gets plain data back.  A submission's ``conftest.py``, ``pytest.ini``,
``pyproject.toml``, ``setup.cfg`` and ``tox.ini`` are never read: pytest does
not look in the submission's folder at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..sandbox.environment import TaskDirectory
from ..sandbox.isolation import Isolation, make_plan, probe
from ..sandbox.limits import Limits
from ..sandbox.outcome import Outcome, Status
from ..sandbox.runs import Run, resolve_user, start
from ..sandbox.session import ForkServer
from ..verdict import Judgement, Verdict, judge
from .connection import ProcessSpec, offered_modules
from .evidence import EvidenceRecorder
from .imports import missing_reason, own_modules, refused
from .results import SubmissionResult
from .submissions import Layout, Submission, SubmissionError, lay_out, requirement_names
from .venvs import BaseLibrary, create_venv, grader_site_hidden, pip_install_command
from .wheelhouse import fetch_command, offline_layers, requirements_of

__all__ = [
    "Suite",
    "SuiteError",
    "GradeSettings",
    "grade_submission",
    "grade_safely",
    "collect_tests",
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

TEST_PATTERNS = ("test_*.py", "*_test.py")
_IGNORED_DIRS = ("__pycache__", ".pytest_cache", ".git")
# Memory of the trusted test process at least (it holds copies of what the submission returns).
TRUSTED_MEMORY = 2 * 1024**3
TRUSTED_PROCESSES = 512  # processes the trusted test process may have beyond the submission's (see trusted_limits)
FORKED_PROCESSES_MAX = 2048  # above this processes limit, trusted test processes are spawned, not forked
# Limits of the collection of the instructor tests (once per grading run, no submission).
COLLECT_LIMITS = Limits(wall_time=120, cpu_time=120, memory=None)
# What the trusted test processes' fork server imports (not the reporter: it reads its nonce at import).
TRUSTED_PRELOAD = (
    "pytest",
    "_pytest.config",
    "_pytest.python",
    "_pytest.unittest",
    "execnet",
    "cellbox.grading.bridge",
    "cellbox.grading.trusted",
)
PYTEST_OPTIONS = [
    "-p",
    "no:cacheprovider",
    "-p",
    "cellbox.grading.reporter",
    "--color=no",
    "--code-highlight=no",
    "--tb=short",
    "-q",
]


class SuiteError(ValueError):
    """The instructor tests cannot be used (not found, none collected, a collection error)."""


def _trusted_argv(config: Path, tests: Path, ini: Path, collect: bool = False) -> list[str]:
    """The command of the trusted test process (:mod:`cellbox.grading.trusted`), with the grader's Python.

    ``python -m`` without flags, so that a fork server may run it: the
    sandbox's environment has no ``PYTHONPATH`` and sets
    ``PYTHONDONTWRITEBYTECODE`` and ``PYTHONUNBUFFERED``; its home is a new
    task directory (no user site-packages).
    """
    return [
        sys.executable,
        "-m",
        "cellbox.grading.trusted",
        *(["--collect"] if collect else []),
        str(config),
        "--",
        "-c",
        str(ini),
        f"--rootdir={tests}",
        f"--confcutdir={tests}",
        *PYTEST_OPTIONS,
        *(["--collect-only"] if collect else []),
        str(tests),
    ]


def _trusted_env() -> dict[str, str]:
    return {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def collect_tests(tests: Path, limits: Limits = COLLECT_LIMITS) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The node ids pytest collects from the instructor tests in ``tests`` (a grader-owned copy), with no submission.

    Returns the node ids, and the top-level names the tests imported that the
    grader's Python lacks (the submission's modules, or a missing library).

    Every module a test imports that is not found in the grader's environment
    or the tests' folder is a placeholder (:mod:`cellbox.grading.trusted`), so
    what is collected does not depend on any submission.

    Raises:
        SuiteError: a test file does not collect (with pytest's one-line error), or nothing is collected.
    """
    config = tests.parent / "collect.json"
    config.write_text(json.dumps({"tests": str(tests)}))
    ini = tests.parent / "pytest.ini"
    ini.write_text(PYTEST_INI)
    nonce = secrets.token_hex(16)
    recorder = EvidenceRecorder(nonce, None)
    outcome = start(
        _trusted_argv(config, tests, ini, collect=True),
        limits=limits,
        cwd=tests,
        env=_trusted_env(),
        stdin=nonce + "\n",
        channel=True,
        on_message=recorder.feed,
    ).wait()
    if recorder.collect_errors:
        raise SuiteError(f"the tests do not collect: {recorder.collect_errors[0]}")
    if recorder.collected is None or outcome.status is not Status.OK:
        raise SuiteError(
            f"the tests could not be collected (pytest: {outcome.status.value}, "
            f"exit {outcome.exit_code}): {_last_line(outcome)}"
        )
    return recorder.collected, recorder.imports


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
        expected: the node ids pytest collects from them (:func:`collect_tests`).
        digests: SHA-256 of each instructor file copied into a task, by relative path
            (``--resume`` compares them with the first run's).
        only: when ``--tests`` named one file: the files copied (it and a
            ``conftest.py`` beside it); ``None`` copies the whole folder.
        imports: top-level names the tests import that the grader's Python lacks (found at collection).
        modules: the submission's modules as the instructor named them (``--modules``), or ``None``
            for the default rules (:mod:`cellbox.grading.imports`).
    """

    root: Path
    files: tuple[str, ...]
    expected: tuple[str, ...]
    only: tuple[str, ...] | None = None
    digests: dict[str, str] = dataclasses.field(default_factory=dict)
    imports: tuple[str, ...] = ()
    modules: tuple[str, ...] | None = None

    def lacking(self) -> tuple[str, ...]:
        """Names the tests import that the grader's Python lacks and no submission may serve."""
        return tuple(name for name in self.imports if refused(name, self.modules))

    @classmethod
    def find(cls, path: str | os.PathLike[str], modules: tuple[str, ...] | None = None) -> Suite:
        """The suite at ``path``: a folder of tests, or one test file; ``modules`` as ``--modules`` named them.

        Raises:
            SuiteError: nothing there, no ``test_*.py`` / ``*_test.py`` file, no
                test collected from them, or a file that does not collect.
        """
        given = Path(path).resolve()
        if given.is_file() and given.suffix == ".py":
            only = tuple(name for name in (given.name, "conftest.py") if (given.parent / name).is_file())
            return dataclasses.replace(cls._checked(given.parent, (given.name,), only, path), modules=modules)
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
        return dataclasses.replace(cls._checked(given, tuple(sorted(found)), None, path), modules=modules)

    @classmethod
    def _checked(cls, root: Path, files: tuple[str, ...], only: tuple[str, ...] | None, given: object) -> Suite:
        suite = cls(root=root, files=files, expected=(), only=only)
        folder = Path(tempfile.mkdtemp(prefix="cellbox-collect-"))
        try:
            tests = suite.copy_to(folder / "tests")
            digests = file_digests(tests)
            expected, imports = collect_tests(tests)
        except SuiteError as exc:
            raise SuiteError(f"{given}: {exc}") from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not expected:
            raise SuiteError(f"{given}: no tests found (pytest collected nothing from {', '.join(files)})")
        return dataclasses.replace(suite, expected=expected, digests=digests, imports=imports)

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
            "digests": self.digests,
            "imports": list(self.imports),
            "modules": None if self.modules is None else list(self.modules),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Suite:
        only = data.get("only")
        return cls(
            root=Path(data["root"]),
            files=tuple(data["files"]),
            expected=tuple(data["expected"]),
            only=tuple(only) if only else None,
            digests=dict(data.get("digests") or {}),
            imports=tuple(data.get("imports") or ()),
            modules=None if data.get("modules") is None else tuple(data["modules"]),
        )


@dataclasses.dataclass(frozen=True)
class GradeSettings:
    """How every submission of a grading run is graded.

    Attributes:
        limits: the sandbox limits of the install and of the test run (each).
        find_links: a folder or URL of wheels pip may install from (``--find-links``).
        task_root: the folder task directories are made in (default: the system temp folder).
        isolation: the namespace layers of the install and of the submission's
            process (:class:`~cellbox.sandbox.isolation.Isolation`); both run with
            the network off, whatever it says (the grader's side fetches what the install needs).
        test_timeout: seconds each test may spend in calls into the submission
            when it has no ``timeout`` marker; ``None``: only the whole run's wall time.
    """

    limits: Limits = Limits()
    find_links: str | None = None
    task_root: str | None = None
    isolation: Isolation = GRADE_ISOLATION
    test_timeout: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "limits": self.limits.as_dict(),
            "find_links": self.find_links,
            "task_root": self.task_root,
            "isolation": dataclasses.asdict(self.isolation),
            "test_timeout": self.test_timeout,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradeSettings:
        return cls(
            limits=Limits(**data["limits"]),
            find_links=data.get("find_links"),
            task_root=data.get("task_root"),
            isolation=Isolation.from_options(**data["isolation"]),
            test_timeout=data.get("test_timeout"),
        )

    def child_owner(self) -> tuple[int, int] | None:
        """``(uid, gid)`` the children will run as when that is not this process's user, else ``None``.

        With the ``user`` isolation layer, a grader running as root runs its
        children as ``nobody`` (:mod:`cellbox.sandbox.isolation`): the submission's
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


# Variables of the grader's environment its pip download keeps: pip's own settings, proxies, CA bundles.
_FETCH_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE")


def _fetch(layout: Layout, wheelhouse: Path, space: _Workspace, settings: GradeSettings) -> Outcome | None:
    """The grader's ``pip download`` of what ``layout`` declares into ``wheelhouse``; ``None``: nothing to fetch.

    The grader's side, with the network: pip reads only the specifiers the
    grader wrote (:func:`requirements_of` checked them) and takes wheels only.

    Raises:
        RequirementError: a requirement the grader will not fetch (the submission's row says which).
    """
    requirements = requirements_of(layout)
    if not requirements:
        return None
    listed = space.grader / "requirements.txt"
    listed.write_text("".join(f"{line}\n" for line in requirements))
    env = {name: value for name, value in os.environ.items() if name.startswith("PIP_") or name in _FETCH_ENV}
    return space.switch.run(
        fetch_command(listed, wheelhouse, settings.find_links),
        limits=trusted_limits(settings.limits),
        cwd=space.grader,
        env=env,
        isolation=Isolation(mode="none"),
    )


def _install(layout: Layout, python: Path, wheelhouse: Path, space: _Workspace, settings: GradeSettings) -> Outcome:
    """``pip install --no-index`` from ``wheelhouse``, in the sandbox, offline, the grader's packages out of view."""
    command = pip_install_command(
        python, package=layout.package, requirements=layout.requirements, wheelhouse=wheelhouse
    )
    return space.run(
        command,
        limits=settings.limits,
        cwd=layout.root,
        env=_venv_env(python.parent.parent),
        isolation=_without_grader_packages(settings.isolation, keep=("pip",)),
    )


def _without_grader_packages(isolation: Isolation, keep: tuple[str, ...] = ()) -> Isolation:
    """``isolation`` with the network off and the grader's site directories covered, but for ``keep``."""
    hidden, shown = grader_site_hidden(keep)
    return dataclasses.replace(
        isolation, network=False, hidden=(*isolation.hidden, *hidden), read_only=(*isolation.read_only, *shown)
    )


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

    Args:
        forkservers: the warm servers the trusted test processes of this grading
            run are forked from (:class:`TrustedServers`), or ``None`` to spawn them.
    """

    def __init__(self, forkservers: TrustedServers | None = None) -> None:
        self.forkservers = forkservers
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

    @contextlib.contextmanager
    def forkserver(self) -> Iterator[ForkServer | None]:
        """A fork server no other thread is using for the while, or ``None`` (spawn)."""
        if self.forkservers is None:
            yield None
            return
        with self.forkservers.lease() as server:
            yield server

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

    The grader's directory (the copy of the tests, the ini, the trusted
    process's config) is not inside the task directory, which the
    submission's processes may write everywhere; with the ``fs`` isolation
    layer they do not see it at all.
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

    def remove(self) -> None:
        self.task.remove()
        shutil.rmtree(self.grader, ignore_errors=True)


class TrustedServers:
    """Warm fork servers for the trusted test processes of one grading run (pytest and the bridge imported).

    They save each submission the imports of pytest, the bridge and execnet (a
    few hundred milliseconds of CPU).  Nothing of a submission ever runs in
    them or in what they fork.  A fork server's session takes one run at a
    time, so there is one per grading thread (``count``); close them when the
    grading run ends.
    """

    def __init__(self, count: int) -> None:
        self._servers = [ForkServer(preload=list(TRUSTED_PRELOAD), warm=None).start() for _ in range(max(1, count))]
        self._free: queue.SimpleQueue[ForkServer] = queue.SimpleQueue()
        for server in self._servers:
            self._free.put(server)

    @contextlib.contextmanager
    def lease(self) -> Iterator[ForkServer]:
        """One server, no other thread's until the block ends."""
        server = self._free.get()
        try:
            yield server
        finally:
            self._free.put(server)

    def close(self) -> None:
        for server in self._servers:
            server.close()

    def __enter__(self) -> TrustedServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def trusted_limits(limits: Limits) -> Limits:
    """The limits of the trusted test process: the run's wall time; CPU, memory and processes to spare.

    Its CPU is pytest's, not the submission's (each submission process has the
    grading limits of its own), so it gets the whole wall time.
    """
    memory = None if limits.memory is None else max(limits.memory, TRUSTED_MEMORY)
    # Its processes limit must stay above what it starts the submission's process with: without a pids cgroup
    # (not root) that limit is RLIMIT_NPROC, counted on top of the user's processes at each start, and a
    # child cannot raise the hard limit it inherited.
    # Likewise it stays below the fork server's own (4096, see cellbox.sandbox.session), when it is forked from one.
    return limits.replace(
        cpu_time=max(limits.cpu_time, limits.wall_time), memory=memory, processes=limits.processes + TRUSTED_PROCESSES
    )


def _run_config(
    space: _Workspace, layout: Layout, python: Path, lib: Path, settings: GradeSettings, suite: Suite
) -> Path:
    """Write the trusted process's config (how to start the submission's process) into the grader directory."""
    venv = python.parent.parent
    spec = ProcessSpec(
        python=str(python),
        lib=str(lib),
        root=str(layout.root),
        task=str(space.task.path),
        limits=settings.limits,
        isolation=_without_grader_packages(settings.isolation),
        env=_venv_env(venv),
    )
    offered = offered_modules(layout.root, venv)
    own = own_modules(offered, requirement_names(layout), suite.modules)
    config = {
        "tests": str(space.grader / "tests"),
        "offered": own,
        "withheld": sorted(set(offered) - set(own)),
        "named": None if suite.modules is None else list(suite.modules),
        "test_timeout": settings.test_timeout,
        "process": spec.to_json(),
    }
    path = space.grader / "bridge.json"
    path.write_text(json.dumps(config))
    return path


def _instructor_digests(grader: Path) -> dict[str, str]:
    return file_digests(grader / "tests") | {"../pytest.ini": _digest(grader / "pytest.ini")}


def _run_tests(
    space: _Workspace, layout: Layout, python: Path, suite: Suite, settings: GradeSettings, base: BaseLibrary
) -> tuple[EvidenceRecorder, Outcome]:
    """Run the trusted test process; return what the reporter said and how the run ended."""
    lib = base.copy_to(space.task.path / "lib")
    tests = suite.copy_to(space.grader / "tests")
    (space.grader / "pytest.ini").write_text(PYTEST_INI)
    config = _run_config(space, layout, python, lib, settings, suite)
    before = _instructor_digests(space.grader)
    nonce = secrets.token_hex(16)
    recorder = EvidenceRecorder(nonce, suite.expected)
    # Its own task directory (not the submission's), as the grader's user, no namespaces: it starts the
    # submission's sandbox itself, and never runs the submission's code.
    limits = trusted_limits(settings.limits)
    with space.switch.forkserver() as server:
        outcome = space.switch.run(
            _trusted_argv(config, tests, space.grader / "pytest.ini"),
            limits=limits,
            cwd=tests,
            env=_trusted_env(),
            stdin=nonce + "\n",
            channel=True,
            on_message=recorder.feed,
            isolation=Isolation(mode="none"),
            forkserver=server if limits.processes <= FORKED_PROCESSES_MAX else None,
        )
    recorder.check_files(before, _instructor_digests(space.grader))
    return recorder, outcome


def _grade_in(
    space: _Workspace, submission: Submission, suite: Suite, settings: GradeSettings, base: BaseLibrary
) -> SubmissionResult:
    lacking = suite.lacking()
    if lacking:
        return _result(submission, Verdict.UNVERIFIED, missing_reason(lacking[0]))
    layout = lay_out(submission, space.task.work / "submission")
    python = create_venv(space.task.path / "venv")
    space.give(layout.root)
    space.give(space.task.path / "venv")
    install = None
    if layout.package or layout.requirements:
        wheelhouse = space.task.path / "wheelhouse"
        wheelhouse.mkdir()
        fetch = _fetch(layout, wheelhouse, space, settings)
        if fetch is not None and fetch.status is not Status.OK:
            verdict = Verdict.TIMED_OUT if fetch.status is Status.TIMED_OUT else Verdict.UNVERIFIED
            reason = f"fetching the requirements ended with status {fetch.status.value}: {_last_line(fetch)}"
            return _result(submission, verdict, reason, install={**fetch.to_json(), "step": "fetch"})
        space.give(wheelhouse)
        ran = _install(layout, python, wheelhouse, space, settings)
        install = {**ran.to_json(), "step": "install", "offline": offline_layers(ran.isolation)}
        if ran.status is not Status.OK:
            verdict = Verdict.TIMED_OUT if ran.status is Status.TIMED_OUT else Verdict.UNVERIFIED
            reason = f"install ended with status {ran.status.value}: {_last_line(ran)}"
            return _result(submission, verdict, reason, install=install)
    recorder, outcome = _run_tests(space, layout, python, suite, settings, base)
    judgement = judge(outcome.exit_code, recorder.evidence(), outcome)
    if recorder.missing_modules and judgement.verdict is not Verdict.TIMED_OUT:
        judgement = Judgement(Verdict.UNVERIFIED, missing_reason(recorder.missing_modules[0]))
    return _result(
        submission,
        judgement.verdict,
        judgement.reason,
        tests=recorder.tests(),
        running=recorder.running,
        install=install,
        run=outcome.to_json(),
        submission_runs=recorder.runs,
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
    result.fill_tests(suite.expected)
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
        result = _result(
            submission,
            Verdict.UNVERIFIED,
            f"grader error: {type(exc).__name__}: {first}",
            duration=time.monotonic() - started,
        )
        result.fill_tests(suite.expected)
        return result
