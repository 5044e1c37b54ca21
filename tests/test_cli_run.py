"""``cellbox run`` end to end: through ``cellbox.cli.main`` and through the installed script.

Every test starts a real child under real limits; the expected exit statuses
come from the same table the command uses (``STATUS_EXIT_CODES``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cellbox.cli import main
from cellbox.sandbox import pids_cgroup_root
from cellbox.sandbox.outcome import STATUS_EXIT_CODES, Status
from sandboxkit import DESIGN_KEYS, marker, survivors
from test_isolation import require_layers

ROOT = Path(__file__).resolve().parents[1]
CELLBOX = Path(sys.executable).with_name("cellbox")
ROOT_WARNING = (
    "cellbox: warning: the child ran as root, so the limits did not contain it: root may raise its own limits, "
    "and it could read and change any file and stop any process on this machine "
    "(use --user NAME to run it as an unprivileged user)"
)
STATUS_LINE = re.compile(r"^cellbox: status=(\w+) (exit=-?\d+|signal=SIG\w+) wall=[\d.]+s cpu=[\d.]+s peak=\S+")
IS_ROOT = os.geteuid() == 0

# One small program per status, with the flags that make it end that way.
PROGRAMS = {
    Status.OK: ([], "print('hello')"),
    Status.ERROR: ([], "raise SystemExit(3)"),
    Status.CRASHED: ([], "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"),
    Status.TIMED_OUT: (["--wall", "1"], "import time; time.sleep(30)"),
    Status.CPU_LIMIT: (["--cpu", "1"], "while True: pass"),
    Status.MEMORY_LIMIT: (["--memory", "256M"], "blocks = [bytearray(1 << 20) for _ in range(1024)]"),
    Status.OUTPUT_LIMIT: (["--output", "10K"], "while True: print('x' * 100)"),
}


def program(tmp_path: Path, code: str, name: str = "program.py") -> str:
    path = tmp_path / name
    path.write_text(code + "\n")
    return str(path)


def status_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("cellbox: status=")]


def run_script(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the installed ``cellbox`` script, as a user would, with no stdin."""
    assert CELLBOX.exists(), f"{CELLBOX} is missing: install the project (pip install -e .)"
    return subprocess.run(
        [str(CELLBOX), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=timeout
    )


# ---------------------------------------------------------------- through main()


def test_ok_run_prints_output_and_one_status_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", program(tmp_path, "print('hello')")])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == "hello\n"
    assert len(status_lines(err)) == 1
    match = STATUS_LINE.match(status_lines(err)[0])
    assert match and match.group(1) == "ok" and match.group(2) == "exit=0"


@pytest.mark.parametrize("status", list(PROGRAMS), ids=[status.value for status in PROGRAMS])
def test_exit_status_follows_the_run_status(status: Status, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags, code = PROGRAMS[status]
    exit_status = main(["run", *flags, program(tmp_path, code)])
    _out, err = capsys.readouterr()
    assert exit_status == STATUS_EXIT_CODES[status]
    [line] = status_lines(err)
    assert line.startswith(f"cellbox: status={status.value} ")


def test_exit_statuses_are_distinct_and_keep_0_to_2_for_ok_and_cellbox_itself() -> None:
    codes = list(STATUS_EXIT_CODES.values())
    assert set(STATUS_EXIT_CODES) == set(Status)
    assert len(set(codes)) == len(codes)
    assert STATUS_EXIT_CODES[Status.OK] == 0
    assert all(code > 2 for status, code in STATUS_EXIT_CODES.items() if status is not Status.OK)


def test_crash_names_the_signal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", program(tmp_path, PROGRAMS[Status.CRASHED][1])])
    [line] = status_lines(capsys.readouterr().err)
    assert "signal=SIGSEGV" in line


def test_json_prints_one_object_with_the_design_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", program(tmp_path, "print('hello')")])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    assert out.endswith("\n") and out.count("\n") == 1
    outcome = json.loads(out)
    assert DESIGN_KEYS <= set(outcome)
    assert outcome["status"] == "ok"
    assert outcome["exit_code"] == 0 and outcome["signal"] is None
    assert outcome["stdout"] == "hello\n" and outcome["truncated"] is False
    assert outcome["as_root"] is False  # isolation auto: as root, uid 0 without root's capabilities


def test_json_of_a_timed_out_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--wall", "1", str(ROOT / "examples" / "sleep_forever.py")])
    outcome = json.loads(capsys.readouterr().out)
    assert code == STATUS_EXIT_CODES[Status.TIMED_OUT]
    assert outcome["status"] == "timed_out"
    assert outcome["stdout"] == "going to sleep\n"
    assert outcome["limits"]["wall_time"] == 1.0


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--memory", "lots"), ("--wall", "soon"), ("--cpu", "-1"), ("--output", "1X"), ("--nice", "40")],
)
def test_bad_limit_text_is_one_line_and_exit_2(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", flag, value, program(tmp_path, "print('never')")])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert flag in err and value in err


def test_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.py")
    code = main(["run", missing])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.splitlines() == [f"cellbox run: error: {missing}: no such file"]


def test_nothing_to_run_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and "nothing to run" in err


def test_bad_env_item_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--env", "NOVALUE", program(tmp_path, "print('never')")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and "NAME=VALUE" in err


def test_double_dash_runs_a_command_with_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "a", "b c", "--wall"])
    assert code == 0
    assert capsys.readouterr().out == "['a', 'b c', '--wall']\n"


def test_file_arguments_reach_the_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", program(tmp_path, "import sys; print(sys.argv[1:])"), "one", "two"])
    assert code == 0
    assert capsys.readouterr().out == "['one', 'two']\n"


def test_env_option_reaches_child_and_parent_secret_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLBOX_TEST_SECRET", "s3cret")
    code = main(
        [
            "run",
            "--env",
            "GREETING=hello world",
            program(tmp_path, "import os; print(os.environ.get('GREETING'), os.environ.get('CELLBOX_TEST_SECRET'))"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out == "hello world None\n"
    assert "s3cret" not in out


def test_cwd_option_sets_the_working_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--cwd", str(tmp_path), "--", sys.executable, "-c", "import os; print(os.getcwd())"])
    assert code == 0
    assert capsys.readouterr().out == f"{tmp_path}\n"


@pytest.mark.skipif(not IS_ROOT, reason="the warning is printed only when cellbox runs as root")
def test_root_run_warns_that_root_is_not_contained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", "--isolation", "none", program(tmp_path, "print('hello')")])
    err = capsys.readouterr().err
    assert ROOT_WARNING in err.splitlines()
    assert status_lines(err)[0].endswith("(ran as root: not contained)")


@pytest.mark.skipif(IS_ROOT, reason="checks the run of an ordinary user")
def test_ordinary_user_run_has_no_root_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", program(tmp_path, "print('hello')")])
    err = capsys.readouterr().err
    assert "root" not in err


@pytest.mark.skipif(not IS_ROOT, reason="--user needs root")
def test_user_option_runs_the_child_unprivileged_without_warning(capsys: pytest.CaptureFixture[str]) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    code = main(["run", "--user", "nobody", "--cwd", "/", "--", "sh", "-c", "id -u"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == f"{nobody}\n"
    assert "root" not in err


@pytest.mark.skipif(not IS_ROOT, reason="--user needs root")
def test_user_who_cannot_reach_the_program_gets_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    script = hidden / "tool"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o755)
    code = main(["run", "--user", "nobody", "--cwd", "/", "--", str(script)])
    out, err = capsys.readouterr()
    assert code != 0
    assert out == ""
    assert f"cellbox: user 'nobody' cannot run {script}" in err


def test_unknown_user_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--user", "no-such-user-here", program(tmp_path, "print('never')")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and "no-such-user-here" in err


# ---------------------------------------------------------------- the installed script


def test_script_ok_run(tmp_path: Path) -> None:
    result = run_script("run", program(tmp_path, "print('hello')"))
    assert result.returncode == 0
    assert result.stdout == "hello\n"
    [line] = status_lines(result.stderr)
    assert line.startswith("cellbox: status=ok exit=0 ")


def test_script_timed_out_exit_status(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_script("run", "--wall", "1", str(ROOT / "examples" / "sleep_forever.py"))
    assert result.returncode == STATUS_EXIT_CODES[Status.TIMED_OUT]
    assert result.stdout == "going to sleep\n"
    assert time.monotonic() - started < 10


def test_script_json_is_one_object(tmp_path: Path) -> None:
    result = run_script("run", "--json", "--", sys.executable, "-c", "raise SystemExit(4)")
    outcome = json.loads(result.stdout)
    assert result.returncode == STATUS_EXIT_CODES[Status.ERROR]
    assert DESIGN_KEYS <= set(outcome)
    assert outcome["status"] == "error" and outcome["exit_code"] == 4


def test_script_bad_limit_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_script("run", "--memory", "lots", program(tmp_path, "print('never')"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "'lots'" in result.stderr


def test_script_env_option_reaches_child_and_parent_secret_does_not(tmp_path: Path) -> None:
    env = {**os.environ, "CELLBOX_TEST_SECRET": "s3cret"}
    code = "import os; print(os.environ.get('GREETING'), os.environ.get('CELLBOX_TEST_SECRET'))"
    result = run_script("run", "--env", "GREETING=hi", program(tmp_path, code), env=env)
    assert result.returncode == 0
    assert result.stdout == "hi None\n"


def test_script_ctrl_c_kills_the_run_and_exits_130() -> None:
    mark = marker()
    code = f"import time; print('ready', flush=True); time.sleep(60)  # {mark}"
    # A shell without job control starts a background command with SIGINT ignored (POSIX, "Signals" of sh),
    # and an ignored signal stays ignored across exec, so `cellbox run` would rightly ignore Ctrl-C too (the
    # suite run with `&` hung here). A handler of this process's own is reset to the default by exec.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [str(CELLBOX), "run", "--", sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        assert survivors(mark), "the sleeping child should be running before Ctrl-C"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "cellbox run: interrupted"
    assert survivors(mark) == []


# ---------------------------------------------------------------- limits this process was given, and the status line


CAPPED = "capped at the hard limit this process inherited"


def run_in_shell(shell: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``shell`` with bash, ``$CELLBOX`` the installed script; stderr merged into stdout, as a terminal shows it."""
    return subprocess.run(
        ["bash", "-c", shell],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "CELLBOX": str(CELLBOX)},
        timeout=timeout,
        cwd="/tmp",
    )


def test_nested_run_under_a_lower_process_hard_limit_runs(tmp_path: Path) -> None:
    # The launcher asked RLIMIT_NPROC for more than the hard limit it inherited:
    # for a normal user that was a silent exit 126 with no output.
    result = run_in_shell('ulimit -u 60; exec "$CELLBOX" run --isolation none -- /bin/echo hi')
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("hi\ncellbox: status=ok exit=0 ")
    if not IS_ROOT and pids_cgroup_root() is None:
        assert f"cellbox: note: processes: {CAPPED} (RLIMIT_NPROC 60, " in result.stdout


@pytest.mark.parametrize(
    ("ulimit", "rlimit", "expected", "note"),
    [
        ("-n 100", "RLIMIT_NOFILE", "(100, 100)", f"open_files: {CAPPED} (RLIMIT_NOFILE 100, asked for 256)"),
        ("-t 5", "RLIMIT_CPU", "(4, 5)", f"cpu_time: {CAPPED} (RLIMIT_CPU 5, asked for 31)"),
    ],
    ids=["open_files", "cpu_time"],
)
def test_limit_above_the_inherited_hard_limit_is_capped_with_a_note(
    ulimit: str, rlimit: str, expected: str, note: str
) -> None:
    code = f"import resource; print(resource.getrlimit(resource.{rlimit}))"
    shell = f'ulimit {ulimit}; exec "$CELLBOX" run --json --isolation none -- {sys.executable} -c "{code}"'
    result = run_in_shell(shell)
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "ok", outcome["stderr"]
    assert outcome["stdout"] == expected + "\n"
    assert note in outcome["notes"]


def test_status_line_counts_the_processes_left_running() -> None:
    mark = marker()
    result = run_in_shell(f'"$CELLBOX" run --isolation none -- sh -c "sleep 100 & sleep 100 & echo started # {mark}"')
    assert result.returncode == 0
    [line] = status_lines(result.stdout)
    assert line.startswith("cellbox: status=ok exit=0 ")
    assert " killed=2" in line
    assert survivors(mark) == []


def test_status_line_starts_its_own_line_after_truncated_output() -> None:
    result = run_in_shell(f'"$CELLBOX" run --output 10 -- {sys.executable} -c \'print("x" * 100)\'')
    assert result.returncode == STATUS_EXIT_CODES[Status.OUTPUT_LIMIT]
    lines = result.stdout.splitlines()
    assert lines[0] == "x" * 10
    assert lines[1].startswith("cellbox: status=output_limit ")


def test_status_line_starts_its_own_line_after_stderr_without_a_newline() -> None:
    result = run_in_shell('"$CELLBOX" run --isolation none -- sh -c "printf oops >&2"')
    assert result.stdout.splitlines()[:2] == ["oops", result.stdout.splitlines()[1]]
    assert result.stdout.splitlines()[1].startswith("cellbox: status=ok exit=0 ")


# ---------------------------------------------------------------- the default isolation

PRIVATE_FOLDER = """
import os
with open("/proc/self/status") as f:
    fields = dict(line.split(":", 1) for line in f)
print("caps", fields["CapEff"].strip())
with open("given.txt") as f:
    print("read", f.read())
with open("made.txt", "w") as f:
    f.write("made")
try:
    print("shadow", "read" if open("/etc/shadow").read(1) else "empty")
except OSError as exc:
    print("shadow", type(exc).__name__)
"""


def hide_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runs of this test find no bwrap: not on PATH, nor where Debian puts it."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("cellbox.sandbox.isolation.BWRAP_FALLBACK", str(tmp_path / "bwrap"))


@pytest.mark.parametrize("bubblewrap", [True, False], ids=["bubblewrap", "no-bubblewrap"])
def test_run_defaults_to_auto_and_keeps_its_private_working_folder(
    bubblewrap: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if bubblewrap:
        require_layers()
    else:
        hide_bubblewrap(monkeypatch, tmp_path)
    folder = Path(tempfile.mkdtemp())  # 0700, this user's only
    try:
        (folder / "given.txt").write_text("given")
        code = main(["run", "--json", "--cwd", str(folder), "--", sys.executable, "-c", PRIVATE_FOLDER])
        outcome = json.loads(capsys.readouterr().out)
        assert code == 0, outcome
        # As root: uid 0 for the folder, none of root's capabilities; /etc/shadow stays out of reach
        # (covered by an empty file in bubblewrap's view, refused by Landlock without it).
        shadow = "empty" if bubblewrap else "PermissionError"
        assert outcome["stdout"] == f"caps 0000000000000000\nread given\nshadow {shadow}\n"
        assert (folder / "made.txt").read_text() == "made"
        assert (folder / "made.txt").stat().st_uid == os.geteuid()
        assert outcome["as_root"] is False
        layers = {"net", "pid", "fs", "user", "landlock"} if bubblewrap else {"landlock"}
        assert layers <= set(outcome["isolation"])
        assert bubblewrap or not {"net", "pid", "fs"} & set(outcome["isolation"])
    finally:
        shutil.rmtree(folder)


def test_run_isolation_none_is_still_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--isolation", "none", program(tmp_path, "print('hello')")])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 0
    assert not {"net", "pid", "fs", "user", "landlock"} & set(outcome["isolation"])
    assert outcome["as_root"] is IS_ROOT


def test_run_help_names_the_default_isolation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: auto)" in text
    assert "under limits and isolation auto" in text
