"""Defaults real programs fit, or a note that names the limit: numpy, the JVM and node's Wasm under `cellbox run`.

Each program runs through ``cellbox run`` at its default limits (2G of address space, RLIMIT_AS), as a
student would start it.  A MemoryError of any module's subclass is ``memory_limit``; a runtime that cannot
*reserve* its address space (the JVM's class space, V8's Wasm guard region) is ``memory_limit`` with a note
that names the cap, the flag that raises it and the runtime's own flags, and those flags make it run.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from cellbox.cli import main
from cellbox.sandbox.classify import JVM_FLAGS
from cellbox.sandbox.limits import Limits, format_size

DEFAULT_MEMORY = format_size(Limits().memory or 0)


def cellbox_run(
    args: list[str], cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict:
    """``cellbox run --json ARGS`` in ``cwd``; its Outcome as a dict."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    main(["run", "--json", *args])
    return dict(json.loads(capsys.readouterr().out))


SUBCLASSES = {
    "plain": "raise MemoryError('no room')",
    "main-subclass": "class _ArrayMemoryError(MemoryError):\n    pass\nraise _ArrayMemoryError('no room')",
    "module-subclass": "from shapes._exceptions import _ArrayMemoryError\nraise _ArrayMemoryError('no room')",
}


@pytest.mark.parametrize("kind", list(SUBCLASSES))
def test_uncaught_memory_error_of_any_subclass_is_memory_limit(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "__init__.py").write_text("")
    (tmp_path / "shapes" / "_exceptions.py").write_text("class _ArrayMemoryError(MemoryError):\n    pass\n")
    (tmp_path / "prog.py").write_text(SUBCLASSES[kind] + "\n")
    outcome = cellbox_run(["prog.py"], tmp_path, capsys, monkeypatch)
    assert outcome["status"] == "memory_limit", outcome["stderr"]
    last = outcome["stderr"].strip().splitlines()[-1]
    assert last.endswith("MemoryError: no room")
    if kind == "module-subclass":
        assert last == "shapes._exceptions._ArrayMemoryError: no room"


def test_an_error_only_named_like_memory_error_is_not_memory_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prog.py").write_text("class MemoryErrorLog(Exception):\n    pass\nraise MemoryErrorLog('full')\n")
    assert cellbox_run(["prog.py"], tmp_path, capsys, monkeypatch)["status"] == "error"


def test_numpy_array_past_the_memory_limit_is_memory_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("numpy", reason="numpy is not installed here")
    (tmp_path / "prog.py").write_text("import numpy\nnumpy.ones(2**33)\n")  # 64 GiB of float64
    outcome = cellbox_run(["prog.py"], tmp_path, capsys, monkeypatch)
    assert outcome["status"] == "memory_limit", outcome["stderr"][-500:]
    assert "_ArrayMemoryError: Unable to allocate 64.0 GiB" in outcome["stderr"]


HELLO_JAVA = 'public class Hello { public static void main(String[] a) { System.out.println("hello"); } }\n'
WASM_JS = textwrap.dedent(
    """
    // The smallest module with one page of memory: V8 reserves a guard region for it.
    const bytes = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 5, 3, 1, 0, 1]);
    new WebAssembly.Instance(new WebAssembly.Module(bytes), {});
    console.log("wasm ok");
    """
)


def test_java_at_the_default_limit_says_which_flags_make_it_fit(
    require_tool: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    java = require_tool("java", install="apt-get install default-jre-headless")
    (tmp_path / "Hello.java").write_text(HELLO_JAVA)
    outcome = cellbox_run(["--", java, "Hello.java"], tmp_path, capsys, monkeypatch)
    assert outcome["status"] == "memory_limit", outcome["stdout"] + outcome["stderr"]
    assert "Could not allocate compressed class space" in outcome["stdout"]  # the JVM says it on stdout
    note = next(note for note in outcome["notes"] if note.startswith("memory: "))
    assert f"under its {DEFAULT_MEMORY} limit (Could not allocate compressed class space)" in note
    assert "raise the limit (cellbox run --memory 4G, or %%limits memory=4G in a cell)" in note
    assert note.endswith(f"or let the program reserve less: {JVM_FLAGS}")
    smaller = cellbox_run(["--", java, *JVM_FLAGS.split()[1:], "Hello.java"], tmp_path, capsys, monkeypatch)
    assert (smaller["status"], smaller["stdout"]) == ("ok", "hello\n")
    raised = cellbox_run(["--memory", "4G", "--", java, "Hello.java"], tmp_path, capsys, monkeypatch)
    assert (raised["status"], raised["stdout"]) == ("ok", "hello\n")


def test_node_wasm_at_the_default_limit_says_which_flag_makes_it_fit(
    require_tool: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = require_tool("node", install="apt-get install nodejs")
    (tmp_path / "wasm.js").write_text(WASM_JS)
    outcome = cellbox_run(["--", node, "wasm.js"], tmp_path, capsys, monkeypatch)
    assert outcome["status"] == "memory_limit", outcome["stderr"][-500:]
    note = next(note for note in outcome["notes"] if note.startswith("memory: "))
    assert f"under its {DEFAULT_MEMORY} limit (Cannot allocate Wasm memory)" in note
    assert "raise the limit (cellbox run --memory 12G, or %%limits memory=12G in a cell)" in note
    assert note.endswith("or let the program reserve less: node --disable-wasm-trap-handler")
    smaller = cellbox_run(["--", node, "--disable-wasm-trap-handler", "wasm.js"], tmp_path, capsys, monkeypatch)
    assert (smaller["status"], smaller["stdout"]) == ("ok", "wasm ok\n")
