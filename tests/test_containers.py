"""Where courses run: cellbox inside sandboxes that refuse what containers refuse, degrading instead of breaking.

Two sandboxes stand in for the containers courses run in:

- ``no-userns``: ``bwrap --dev-bind / / --unshare-user --disable-userns``, which refuses new user
  namespaces as Docker's and Kubernetes' default seccomp profiles do (bubblewrap's layers need one,
  except as root, where plain namespaces still work);
- ``no-userns-landlock-seccomp``: the same, with ``refuse_features.py`` in front, which also refuses
  Landlock (ENOSYS) and seccomp filters (EINVAL), as a strict container profile does.

In each, ``cellbox run``, ``cellbox doctor`` and a real kernel (through jupyter_client) run with
``isolation=auto``, and the tests assert what they get: which layers, which notes, which lines.  Where
bwrap itself cannot make the sandbox, the tests skip with the reason (and fail under CELLBOX_REQUIRE_ALL).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.sandbox.isolation import BWRAP_LAYERS, LAYERS
from conftest import missing
from kernelkit import execute, running_kernel
from sandboxkit import marker, survivors

ROOT = os.geteuid() == 0
REFUSER = str(Path(__file__).with_name("refuse_features.py"))
CELLBOX = [sys.executable, "-c", "import sys; from cellbox.cli import main; sys.exit(main())"]
SANDBOXES = ("no-userns", "no-userns-landlock-seccomp")
# What each sandbox refuses cellbox, in the words of its notes and doctor's lines.
NO_USERNS_WORDS = {
    "no-userns": "cellbox runs in a container or sandbox that allows no user namespace inside it",
    "no-userns-landlock-seccomp": "cellbox runs in a container whose seccomp profile refuses new namespaces",
}
NO_LANDLOCK = "landlock_create_ruleset(2) fails with ENOSYS on Linux 5.13 or later"
NO_FILTER = "this machine refuses to load a seccomp filter (EINVAL"


def sandbox_prefix(kind: str) -> list[str]:
    """The argv prefix that runs a command in sandbox ``kind``; skips (fails in CI) where bwrap cannot make it."""
    bwrap = shutil.which("bwrap") or missing("bubblewrap is not installed", "apt-get install bubblewrap")
    prefix = [bwrap, "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--"]
    if kind == "no-userns-landlock-seccomp":
        prefix += [sys.executable, REFUSER]
    trial = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if trial.returncode != 0:
        why = (trial.stderr.strip().splitlines() or [f"exit status {trial.returncode}"])[0]
        missing(f"bwrap cannot make the {kind} sandbox here ({why})", "a machine where bwrap --unshare-user works")
    return prefix


@pytest.fixture(scope="module", params=SANDBOXES)
def sandbox(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    return request.param, sandbox_prefix(request.param)


def expected_layers(kind: str) -> set[str]:
    """The layers of LAYERS (and the filter) a run gets in sandbox ``kind``, as this user."""
    layers = set(BWRAP_LAYERS) if ROOT else set()  # root needs no user namespace for bwrap's other layers
    if kind == "no-userns":
        layers |= {"landlock", "syscall-filter"}
    return layers


def cellbox(prefix: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *CELLBOX, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


# --------------------------------------------------------------------------- cellbox run


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("course")
    folder.chmod(0o755)
    path = folder / "prog.py"
    path.write_text("import os\nprint('hello from', os.getuid() == os.geteuid())\n")
    path.chmod(0o644)
    return path


def test_run_is_ok_with_the_layers_the_sandbox_allows(sandbox: tuple[str, list[str]], program: Path) -> None:
    kind, prefix = sandbox
    done = cellbox(prefix, "run", "--json", "--wall", "20", str(program), cwd=program.parent)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["status"], outcome["stdout"]) == ("ok", "hello from True\n")
    assert {layer for layer in outcome["isolation"] if layer in (*LAYERS, "syscall-filter")} == expected_layers(kind)
    notes = "\n".join(outcome["notes"])
    if not ROOT:
        assert f"net, pid, fs, user: isolation layers not active: {NO_USERNS_WORDS[kind]}" in notes
    else:
        assert "isolation layers not active" not in notes and "net, pid" not in notes
    if kind == "no-userns-landlock-seccomp":
        assert f"landlock: isolation layer not active: {NO_LANDLOCK}" in notes
        assert f"syscall filter: not applied ({NO_FILTER}" in notes


def test_run_past_its_wall_time_is_stopped_in_the_sandbox(sandbox: tuple[str, list[str]], tmp_path: Path) -> None:
    _kind, prefix = sandbox
    mark = marker()
    # A child that leaves the program's session: the tree kill finds it without a pid namespace too.
    child = "import os, time; os.setsid(); time.sleep(60)"
    leaver = f"import subprocess, time; subprocess.Popen(['python3', '-c', {child!r}, {mark!r}]); time.sleep(60)"
    done = cellbox(prefix, "run", "--json", "--wall", "1", "--", "python3", "-c", leaver, cwd=tmp_path)
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "timed_out"
    assert survivors(mark) == []


def test_strict_isolation_is_one_line_where_a_layer_is_missing(sandbox: tuple[str, list[str]], tmp_path: Path) -> None:
    kind, prefix = sandbox
    done = cellbox(prefix, "run", "--isolation", "strict", "--", "true", cwd=tmp_path)
    if ROOT and kind == "no-userns":
        assert done.returncode == 0  # every layer is there for root
        assert done.stderr.startswith("cellbox: status=ok exit=0 ")
        return
    assert done.returncode == 2
    layer = "net" if not ROOT else "landlock"
    assert done.stderr.startswith(f"cellbox run: error: isolation is strict and the {layer} layer is not available")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- cellbox doctor


def doctor(prefix: list[str], cwd: Path) -> tuple[int, list[str], dict[str, object]]:
    text = cellbox(prefix, "doctor", cwd=cwd)
    report = cellbox(prefix, "doctor", "--json", cwd=cwd)
    return text.returncode, text.stdout.splitlines(), json.loads(report.stdout)


def test_doctor_says_what_is_on_why_the_rest_is_not_and_what_to_do(
    sandbox: tuple[str, list[str]], tmp_path: Path
) -> None:
    kind, prefix = sandbox
    code, lines, report = doctor(prefix, tmp_path)
    by_name = {
        line.split(":")[0].split(" ")[0] if line[:8].strip() in LAYERS else line.split(":")[0]: line for line in lines
    }
    assert by_name["user namespaces"].startswith(f"user namespaces: no: {NO_USERNS_WORDS[kind]}")
    assert report["user_namespaces"] == {"available": False, "reason": by_name["user namespaces"][21:]}
    for layer in LAYERS:
        available = layer in expected_layers(kind)
        assert report["layers"][layer]["available"] is available  # type: ignore[index]
        assert by_name[layer].startswith(f"{layer:8} {'yes' if available else 'no: '}")
    assert code == (0 if all(layer in expected_layers(kind) for layer in LAYERS) else 1)
    if ROOT:
        assert "children run as nobody" in by_name["running as"]
        assert "keep them at uid 0 (no user namespace here) with every capability dropped" in by_name["running as"]
    else:
        assert (
            by_name["running as"] == f"running as: uid {os.geteuid()} (no user layer here: children run as this "
            "user, without a namespace)"
        )
        assert by_name["net"].startswith(f"net      no: {NO_USERNS_WORDS[kind]}")
        assert [by_name[layer] for layer in ("pid", "fs", "user")] == [
            "pid      no: as for net",
            "fs       no: as for net",
            "user     no: as for net",
        ]  # one cause, said once
        assert by_name["disk tmpfs"] == "disk tmpfs: no: it needs the fs layer, which is missing here (above)"
    filtered = kind == "no-userns"
    assert by_name["syscall filter"] == (
        "syscall filter: yes"
        if filtered
        else f"syscall filter: no: {NO_FILTER}; a container's seccomp profile may forbid it)"
    )
    protecting = by_name["still protecting every run"]
    assert protecting.startswith("still protecting every run: rlimits, the environment allowlist and the process-tree")
    assert ("landlock (files outside the run out of reach)" in protecting) is filtered
    assert ("the syscall filter" in protecting) is filtered
    assert ("pid (no other process in sight)" in protecting) is ROOT
    assert lines[-1] == f"to get more: {report['advice'] or 'nothing; every layer works here'}"
    if not ROOT:
        assert lines[-1].startswith(
            "to get more: start the container with user namespaces allowed: docker run "
            "--security-opt seccomp=unconfined"
        )
    elif not filtered:
        assert lines[-1].startswith("to get more: run cellbox where the kernel's Landlock and seccomp are allowed")
    else:
        assert lines[-1] == "to get more: nothing; every layer works here"


# --------------------------------------------------------------------------- the kernel


@pytest.fixture(scope="module")
def sandboxed_kernel(
    sandbox: tuple[str, list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, object]]:
    kind, prefix = sandbox
    with running_kernel("cellbox", cwd=str(tmp_path_factory.mktemp("notebook")), prefix=prefix) as (_km, kc):
        yield kind, kc


@pytest.mark.slow
def test_kernel_in_the_sandbox_carries_state_stops_a_runaway_and_says_what_it_lacks(
    sandboxed_kernel: tuple[str, object],
) -> None:
    kind, kc = sandboxed_kernel
    kc.kernel_info()  # type: ignore[attr-defined]
    banner = kc.get_shell_msg(timeout=60)["content"]["banner"]  # type: ignore[attr-defined]
    if ROOT:
        assert "its cells run as root (no user namespace here) with every capability dropped" in banner
    else:
        active = "landlock" if kind == "no-userns" else "no layer"
        assert f"Isolation auto: {active} (net, pid, fs, user: not available: {NO_USERNS_WORDS[kind]}" in banner
    first = execute(kc, "x = 21")  # type: ignore[arg-type]
    assert first.status == "ok", first.traceback
    said = first.notes  # beside the cell, never on its stderr (graders score stderr)
    assert first.stream("stderr") == ""
    if not ROOT:
        assert f"net, pid, fs, user: isolation layers not active: {NO_USERNS_WORDS[kind]}" in said
    if kind == "no-userns-landlock-seccomp":
        assert f"landlock: isolation layer not active: {NO_LANDLOCK}" in said
    if ROOT and kind == "no-userns":
        assert said == ""  # nothing is missing: nothing to say
    assert execute(kc, "print(x * 2)").stream() == "42\n"  # type: ignore[arg-type]
    runaway = execute(kc, "%%limits wall=2\nx = 0\nwhile True: pass")  # type: ignore[arg-type]
    assert [error["ename"] for error in runaway.errors] == ["CellTimeoutError"]
    after = execute(kc, "print(x)")  # type: ignore[arg-type]
    assert (after.status, after.stream()) == ("ok", "21\n")  # the stopped cell's change is gone


def test_doctor_where_bwrap_is_refused_its_namespaces_says_what_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A container's default seccomp profile: bwrap's namespaces fail with EPERM, for root as for a user.
    fake = tmp_path / "bwrap"
    fake.write_text('#!/bin/sh\necho "bwrap: Creating new namespace failed: Operation not permitted" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    from cellbox.cli import main

    assert main(["doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"bubblewrap: {fake}"
    assert [line[:9] for line in lines if line.startswith(("pid ", "fs "))] == ["pid      ", "fs       "]
    assert "pid      no: as for net" in lines
    if ROOT:
        assert (
            "net      no: bwrap cannot start here (bwrap: Creating new namespace failed: Operation not permitted)"
            in lines
        )
        assert "user     yes" in lines  # a plain switch to another user needs no bwrap
        assert lines[-1].startswith("to get more: bubblewrap as root needs CAP_SYS_ADMIN: start the container with ")
    else:
        # The cause's first words depend on the machine (a sysctl, AppArmor, a container); bwrap's own do not.
        refused = (
            "no user namespace, so no bubblewrap layer (bwrap: Creating new namespace failed: Operation not permitted)"
        )
        assert lines[3].startswith("net      no: ") and lines[3].endswith(refused)
        assert "user     no: as for net" in lines
        assert lines[-1].startswith("to get more: ") and "user namespaces" in lines[-1]
