"""A submission's own build and install run offline; its declared requirements come through the grader's side.

A package's build backend is the submission's code: an in-tree backend
(``backend-path = ["."]``) that tries to reach a listener on the grader's
127.0.0.1 reaches nothing, and the submission is still installed and graded.
Its requirements are plain specifiers the grader fetches as wheels; options,
URLs and paths are refused with one line.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.grading.submissions import Layout, discover
from cellbox.grading.task import GradeSettings, Suite, _without_grader_packages, grade_safely
from cellbox.grading.venvs import BaseLibrary, grader_site_hidden
from cellbox.grading.wheelhouse import DEFAULT_BACKEND, RequirementError, requirements_of
from cellbox.sandbox import run
from cellbox.sandbox.isolation import Isolation
from cellbox.sandbox.limits import Limits
from cellbox.verdict import Verdict
from grading_cases import GOOD_FIB, write_suite, write_tree

LIMITS = Limits(wall_time=120, cpu_time=60, memory=2 * 1024**3)

# An in-tree PEP 517 backend (no build requirements) that builds a wheel holding fib.py by hand, after
# trying to reach the grader's 127.0.0.1:PORT and to import the grader's distributed.
BACKEND = """
import base64, hashlib, io, os, socket, sys, zipfile

FIB = {fib!r}
TRIED = []

def _attack():
    try:
        with socket.create_connection(("127.0.0.1", {port}), timeout=3) as conn:
            conn.sendall(b"reached from the build backend")
        TRIED.append("connected")
    except OSError as exc:
        TRIED.append(f"refused: {{exc}}")
    for folder in {sites!r}:
        sys.path.append(folder)
    try:
        import distributed  # noqa: F401
        TRIED.append("distributed imported")
    except ImportError:
        TRIED.append("no distributed")

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _attack()
    print("backend:", TRIED, file=sys.stderr)
    name = "offline_fib-1.0-py3-none-any.whl"
    files = {{
        "fib.py": FIB,
        "offline_fib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: offline-fib\\nVersion: 1.0\\n",
        "offline_fib-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\n"
        "Tag: py3-none-any\\n",
    }}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
            wheel.writestr(path, data)
        record.append("offline_fib-1.0.dist-info/RECORD,,")
        wheel.writestr("offline_fib-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""

PYPROJECT = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "offline-fib"
version = "1.0"
"""


@pytest.fixture(scope="module")
def base() -> Iterator[BaseLibrary]:
    with BaseLibrary.build() as library:
        yield library


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on the grader's 127.0.0.1, never accepting: a connection waits in its backlog."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def reached(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_in_tree_backend_reaches_no_listener_and_the_submission_is_graded(
    tmp_path: Path, base: BaseLibrary, listener: socket.socket
) -> None:
    suite = Suite.find(write_suite(tmp_path / "tests"))
    port = listener.getsockname()[1]
    sites = list(grader_site_hidden()[0])
    write_tree(
        tmp_path / "subs" / "mallory",
        {"pyproject.toml": PYPROJECT, "backend.py": BACKEND.format(fib=GOOD_FIB, port=port, sites=sites)},
    )
    [submission] = discover(tmp_path / "subs")
    result = grade_safely(submission, suite, GradeSettings(limits=LIMITS), base)
    # fib exists only in the wheel the backend built: the tests passing shows the offline install worked.
    assert result.verdict is Verdict.VERIFIED, (result.reason, result.install)
    assert result.passed == 5
    assert result.install is not None and result.install["status"] == "ok"
    offline = result.install["offline"]
    assert offline[0] == "pip --no-index"
    if offline == ["pip --no-index"]:
        pytest.skip(f"no layer here keeps a build offline ({result.install['notes']}); pip --no-index only")
    assert not reached(listener)


def test_the_installs_view_holds_pip_and_none_of_the_graders_packages(tmp_path: Path) -> None:
    hidden, shown = grader_site_hidden(("pip",))
    probe_code = (
        f"import sys; sys.path[:0] = {list(hidden)!r}\n"
        "import pip; print('pip', pip.__version__)\n"
        "for name in ('distributed', 'pytest', 'cellbox'):\n"
        "    try:\n"
        "        __import__(name); print('imported', name)\n"
        "    except ImportError:\n"
        "        print('missing', name)\n"
    )
    isolation = _without_grader_packages(Isolation(mode="auto"), keep=("pip",))
    outcome = run([sys.executable, "-I", "-c", probe_code], limits=Limits(wall_time=30), isolation=isolation)
    if "fs" not in outcome.isolation:
        pytest.skip(f"no fs layer here: the grader's packages stay readable ({outcome.notes})")
    assert outcome.status.value == "ok", outcome.stderr
    assert outcome.stdout.split("\n")[1:] == ["missing distributed", "missing pytest", "missing cellbox", ""]
    assert outcome.stdout.startswith("pip ")


def test_requirements_are_fetched_by_the_grader_and_installed_offline(tmp_path: Path, base: BaseLibrary) -> None:
    # A wheel only in --find-links: the grader's pip download copies it into the wheelhouse, the
    # sandboxed install (no index, no network) takes it from there.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _write_wheel(wheels, "cellbox_offline_dep", "def answer():\n    return 55\n")
    suite = Suite.find(write_suite(tmp_path / "tests"))
    write_tree(
        tmp_path / "subs" / "dave",
        {
            "fib.py": "import cellbox_offline_dep\n\n" + GOOD_FIB,
            "requirements.txt": "cellbox-offline-dep==1.0  # the grader fetches it\n",
        },
    )
    [submission] = discover(tmp_path / "subs")
    settings = GradeSettings(limits=LIMITS, find_links=str(wheels))
    result = grade_safely(submission, suite, settings, base)
    assert result.verdict is Verdict.VERIFIED, (result.reason, result.install)
    assert result.install is not None and result.install["step"] == "install"
    assert result.install["offline"][0] == "pip --no-index"
    assert "cellbox_offline_dep-1.0-py3-none-any.whl" in result.install["stdout"]


def _write_wheel(folder: Path, name: str, code: str) -> None:
    import base64
    import hashlib
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
            wheel.writestr(path, data)
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")


# ---------------------------------------------------------------------- what the grader fetches


def layout_of(root: Path, files: dict[str, str]) -> Layout:
    write_tree(root, files)
    return Layout(
        root=root,
        package=(root / "pyproject.toml").exists() or (root / "setup.py").exists(),
        requirements=(root / "requirements.txt").exists(),
    )


def test_declared_requirements_are_the_specifiers_fetched(tmp_path: Path) -> None:
    layout = layout_of(
        tmp_path,
        {
            "requirements.txt": "# numbers\nnumpy>=1.26 ; python_version >= '3.9'\n\nattrs==23.1\t# pinned\n",
            "pyproject.toml": textwrap.dedent("""
                [build-system]
                requires = ["flit_core>=3.4,<4"]
                build-backend = "flit_core.buildapi"
                [project]
                name = "x"
                version = "1"
                dependencies = ["rich[jupyter]>=13", "numpy>=1.26; python_version >= '3.9'"]
            """),
        },
    )
    assert requirements_of(layout) == [
        'numpy>=1.26; python_version >= "3.9"',
        "attrs==23.1",
        "flit_core<4,>=3.4",
        "rich[jupyter]>=13",
    ]


def test_a_package_without_build_system_gets_pips_default_backend(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, {"setup.py": "from setuptools import setup\nsetup()\n"})
    assert requirements_of(layout) == [*DEFAULT_BACKEND]


@pytest.mark.parametrize(
    "line, what",
    [
        ("--index-url https://evil.example/simple", "is a pip option"),
        ("-e .", "is a pip option"),
        ("-r other.txt", "is a pip option"),
        ("fib @ https://evil.example/fib.whl", "names a URL"),
        ("./vendored/fib", "is not a requirement specifier"),
        ("git+https://evil.example/fib.git", "is not a requirement specifier"),
    ],
)
def test_requirements_that_choose_a_source_are_refused_in_one_line(tmp_path: Path, line: str, what: str) -> None:
    layout = layout_of(tmp_path, {"requirements.txt": f"attrs\n{line}\n"})
    with pytest.raises(RequirementError) as info:
        requirements_of(layout)
    assert str(info.value).startswith("requirements.txt line 2: ") and what in str(info.value)
    assert "\n" not in str(info.value)


def test_a_build_requirement_with_a_url_is_refused(tmp_path: Path) -> None:
    layout = layout_of(
        tmp_path, {"pyproject.toml": '[build-system]\nrequires = ["evil @ file:///etc/passwd"]\nbuild-backend = "x"\n'}
    )
    with pytest.raises(RequirementError, match=r"^pyproject.toml \[build-system\] requires: .* names a URL"):
        requirements_of(layout)


def test_refused_requirements_make_the_submission_unverified_with_the_line(tmp_path: Path, base: BaseLibrary) -> None:
    suite = Suite.find(write_suite(tmp_path / "tests"))
    write_tree(
        tmp_path / "subs" / "erin", {"fib.py": GOOD_FIB, "requirements.txt": "--extra-index-url http://x.example\n"}
    )
    [submission] = discover(tmp_path / "subs")
    result = grade_safely(submission, suite, GradeSettings(limits=LIMITS), base)
    assert result.verdict is Verdict.UNVERIFIED
    assert result.reason.startswith("requirements.txt line 1: '--extra-index-url http://x.example' is a pip option")
    assert result.install is None


def test_finding_the_installs_packages_leaves_setuptools_importable_in_the_grader() -> None:
    # importlib.util.find_spec("pip") runs setuptools' distutils hack, which then turns its own distutils off
    # for the whole process: nbgrader, imported by the grader's process later, failed on `import setuptools`.
    code = (
        "from cellbox.grading.venvs import grader_site_hidden\n"
        "grader_site_hidden(('pip',))\n"
        "import setuptools, distutils.core\n"
        "print('_distutils' in distutils.core.__file__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr[-2000:]
