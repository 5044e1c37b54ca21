"""The cellbox kernelspec: installed by pip with the project, and more of them by ``cellbox install``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from cellbox.cli import main
from cellbox.kernelspec import LOGO_SVG, logo_png
from kernelkit import execute, kernel_manager

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "share" / "jupyter" / "kernels" / "cellbox"


def test_pip_install_puts_the_cellbox_spec_into_the_environment() -> None:
    installed = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "cellbox"
    spec = KernelSpecManager(kernel_dirs=[str(installed.parent)]).get_kernel_spec("cellbox")
    assert spec.display_name == "Python 3 (cellbox)"
    assert spec.language == "python"
    # A leading "python" is replaced by jupyter_client with its own interpreter,
    # so the spec keeps working when the environment moves; -E -P keep the notebook folder and
    # PYTHONPATH off the kernel's import path (see test_trust_import_path).
    assert spec.argv == ["python", "-E", "-P", "-m", "cellbox.kernel", "-f", "{connection_file}"]
    for name in ("kernel.json", "logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
        assert (installed / name).read_bytes() == (SHIPPED / name).read_bytes()
    # Jupyter looks in the environment's share/jupyter by default.
    assert "cellbox" in KernelSpecManager().find_kernel_specs()


def test_jupyter_kernelspec_list_shows_cellbox() -> None:
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("jupyter")), "kernelspec", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert specs["cellbox"]["spec"]["display_name"] == "Python 3 (cellbox)"


def test_shipped_logos_are_the_ones_the_code_draws() -> None:
    assert (SHIPPED / "logo-32x32.png").read_bytes() == logo_png(32)
    assert (SHIPPED / "logo-64x64.png").read_bytes() == logo_png(64)
    assert (SHIPPED / "logo-svg.svg").read_text() == LOGO_SVG
    png = logo_png(64)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert int.from_bytes(png[16:20], "big") == int.from_bytes(png[20:24], "big") == 64


def test_install_writes_a_spec_whose_argv_carries_the_limits(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    status = main(
        [
            "install",
            "--prefix",
            str(tmp_path),
            "--name",
            "cellbox-short",
            "--display-name",
            "Python 3 (short)",
            "--wall",
            "10",
            "--memory",
            "512M",
        ]
    )
    assert status == 0
    target = tmp_path / "share" / "jupyter" / "kernels" / "cellbox-short"
    assert capsys.readouterr().out == f"Installed kernelspec cellbox-short (Python 3 (short)) in {target}\n"
    spec = json.loads((target / "kernel.json").read_text())
    # This interpreter, by its path: a Jupyter of another environment starts the one cellbox is in.
    assert spec["argv"] == [
        sys.executable,
        "-E",
        "-P",
        "-m",
        "cellbox.kernel",
        "-f",
        "{connection_file}",
        "--CellboxKernel.wall_time=10",
        "--CellboxKernel.memory=512M",
    ]
    assert spec["display_name"] == "Python 3 (short)"
    assert (target / "logo-64x64.png").read_bytes() == logo_png(64)


def test_installed_spec_starts_a_kernel_with_its_limits(tmp_path: Path) -> None:
    argv = ["--name", "tight", "--wall", "7", "--output", "32K", "--ceiling", "wall=9", "--session-memory", "2G"]
    assert main(["install", "--prefix", str(tmp_path), *argv]) == 0
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    assert specs.get_kernel_spec("tight").display_name == "Python 3 (tight)"
    km = kernel_manager("tight", kernel_spec_manager=specs)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        assert execute(kc, "%limits").stream() == "wall 7 s, cpu 30 s, memory 2G, output 32K\n"
        # The spec's ceiling holds: a cell that asks for more gets the ceiling, and is told so.
        capped = execute(kc, "%%limits wall=100\n%limits")
        assert capped.stream() == "wall 9 s, cpu 30 s, memory 2G, output 32K\n"
        assert "the cell runs at the ceiling: wall_time=9s" in capped.notes
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--name", "bad name"],
            "cellbox install: error: --name 'bad name': use letters, digits, '-', '.' and '_' only",
        ),
        (
            ["--memory", "lots"],
            "cellbox install: error: --memory: 'lots' is not a size; write a number with an "
            "optional unit, such as 256M, 1.5G or 64K",
        ),
        (
            ["--disk", "1G"],
            "cellbox install: error: --disk: not a limit of a kernel's cells (they share their session's "
            "sandbox); it holds for `cellbox run` and `cellbox grade`",
        ),
        (
            ["--ceiling", "memory=lots"],
            "cellbox install: error: --ceiling: 'lots' is not a size; write a number with an "
            "optional unit, such as 256M, 1.5G or 64K",
        ),
        (
            ["--ceiling", "memory"],
            "cellbox install: error: --ceiling: 'memory' is not NAME=VALUE, such as memory=2G",
        ),
        (
            ["--session-memory", "lots"],
            "cellbox install: error: --session-memory: 'lots' is not a size; write a number with an "
            "optional unit, such as 256M, 1.5G or 64K",
        ),
        (
            ["--shared-memory", "1G"],
            "cellbox install: error: --shared-memory: a kernel's /tmp and /dev/shm are its session's, sized once: "
            "use --ceiling shared_memory=SIZE",
        ),
    ],
)
def test_bad_install_options_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["install", "--prefix", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err == message + "\n"
    assert not (tmp_path / "share").exists()


def test_bad_setting_in_a_spec_names_the_setting(tmp_path: Path) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "cellbox.kernel", "--CellboxKernel.wall_time=-1", "-f", str(tmp_path / "c.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    assert "CellboxKernel.wall_time (wall_time): a time limit must be positive, got -1.0" in started.stderr


def test_install_can_ask_for_isolation(tmp_path: Path) -> None:
    argv = ["--name", "fenced", "--isolation", "auto", "--network", "--start-method", "spawn"]
    assert main(["install", "--prefix", str(tmp_path), *argv]) == 0
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "fenced" / "kernel.json").read_text())
    assert spec["argv"][7:] == [
        "--CellboxKernel.isolation=auto",
        "--CellboxKernel.network=True",
        "--CellboxKernel.start_method=spawn",
    ]


def test_install_says_which_spec_jupyter_will_start_when_another_comes_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The environment's own "cellbox" spec comes first on Jupyter's search path in a virtualenv
    # (JUPYTER_PREFER_ENV_PATH): a spec of the same name installed elsewhere is not the one started.
    chosen = KernelSpecManager().find_kernel_specs()["cellbox"]
    assert main(["install", "--prefix", str(tmp_path), "--isolation", "none"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"cellbox: note: Jupyter will start the kernelspec cellbox in {chosen}, which comes before this one on its "
        "search path: install with --sys-prefix (or the same --prefix) to change that one, or give this one "
        "another --name\n"
    )
    assert main(["install", "--prefix", str(tmp_path), "--name", "cellbox-elsewhere"]) == 0
    assert capsys.readouterr().err == ""


def test_install_writes_the_ceiling_and_the_sessions_memory(tmp_path: Path) -> None:
    argv = ["--name", "class", "--ceiling", "memory=2G", "--ceiling", "processes=100", "--session-memory", "3G"]
    assert main(["install", "--prefix", str(tmp_path), *argv]) == 0
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "class" / "kernel.json").read_text())
    settings = spec["argv"][spec["argv"].index("{connection_file}") + 1 :]
    assert settings == ["--CellboxKernel.ceiling=memory=2G processes=100", "--CellboxKernel.session_memory=3G"]
