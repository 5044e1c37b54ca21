"""The README is a newcomer's first screen or two: short, its two commands first, every link leading somewhere.

Its first command is run here; the tables it points to are checked in ``tests/test_docs.py``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from cellbox.sandbox.outcome import STATUS_EXIT_CODES, Status

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 120  # one screen or two
FIRST_COMMAND_BY_LINE = 30  # after what it runs on, how it installs and what it needs: the lines above them
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def readme_main_command() -> str:
    return re.findall(r"^```sh\n(.*?)\n```", README.read_text(), re.MULTILINE)[0]


def test_main_command_demo_meets_every_limit_and_ends_ok() -> None:
    # The README's first command runs `.venv/bin/cellbox run ...` (then opens the lessons): run that part here.
    argv = shlex.split(next(part for part in readme_main_command().split(" && ") if " run " in f" {part} "))
    assert Path(argv[0]).name == "cellbox" and argv[1] == "run"
    cellbox = Path(sys.executable).with_name("cellbox")
    result = subprocess.run(
        [str(cellbox), *argv[1:]], cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )
    assert result.returncode == STATUS_EXIT_CODES[Status.OK], result.stderr
    assert "MemoryError (RLIMIT_AS)" in result.stdout
    assert "EFBIG (RLIMIT_FSIZE)" in result.stdout
    assert "SIGXCPU after" in result.stdout
    # A reader told to watch the limits stop a program learns why it still ends ok.
    assert result.stdout.splitlines()[-1].startswith("why ok         each limit made one step fail")
    assert result.stderr.startswith("cellbox: status=ok exit=0 ")


def test_readme_fits_on_a_screen_or_two() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move details into docs/"


def test_readme_opens_with_its_two_commands_after_the_venv_note() -> None:
    text = README.read_text()
    blocks = list(_FENCE.finditer(text))
    assert [block.group(1) for block in blocks[:2]] == ["sh", "sh"]
    assert blocks[0].group(2).startswith("python3 -m venv .venv && ")
    assert blocks[1].group(2).startswith("python3 -m venv .venv && ")
    assert "'.[test]'" in blocks[1].group(2) and blocks[1].group(2).strip().endswith(".venv/bin/python -m pytest")
    assert text.count("\n", 0, blocks[1].start()) < FIRST_COMMAND_BY_LINE
    # Debian's python3 cannot make a venv without python3-venv: the reader learns that before the first command.
    assert -1 < text.find("python3-venv") < blocks[0].start()


def anchor(heading: str) -> str:
    """The anchor MyST (myst_heading_anchors) and GitHub give a heading: lower case, punctuation dropped."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_anchor_is_the_one_myst_and_github_give() -> None:
    assert anchor("Limits for one cell: `%%limits`") == "limits-for-one-cell-limits"
    assert anchor("The kernel's session") == "the-kernels-session"


def test_every_relative_link_of_the_readme_leads_to_a_file_and_heading() -> None:
    links = [link for link in _LINK.findall(README.read_text()) if "://" not in link]
    assert links, "the README links into docs/"
    for link in links:
        path, _, fragment = link.partition("#")
        target = (ROOT / path).resolve() if path else README
        assert target.is_file(), f"README link {link!r}: no file {target}"
        if fragment:
            headings = {anchor(heading) for heading in _HEADING.findall(target.read_text())}
            assert fragment in headings, f"README link {link!r}: no such heading in {path}"


def test_readme_links_every_docs_page_a_newcomer_needs() -> None:
    linked = {link.partition("#")[0] for link in _LINK.findall(README.read_text())}
    needed = {
        "docs/index.md",
        "docs/getting-started/students.md",
        "docs/getting-started/instructors.md",
        "docs/getting-started/maintainers.md",
        "docs/reference/settings.md",
        "docs/reference/ipykernel-differences.md",
    }
    assert needed <= linked, needed - linked
    for link in linked:
        if link.startswith("docs/"):
            assert link.endswith(".md") and (ROOT / link).is_file(), link


def test_readme_gives_the_isolation_cellbox_run_uses_by_default() -> None:
    # `cellbox run --help` says which isolation a run gets when --isolation is not given.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cellbox")), "run", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "isolation auto" in " ".join(result.stdout.split())
    assert "By default (`--isolation auto`)" in " ".join(README.read_text().split())


# What a newcomer must learn before the first command: where cellbox runs, how it installs, what it needs and
# how to check, what the commands do and take (docs/index.md says the same before its first page link).
BEFORE_THE_COMMANDS = (
    "Linux",
    "WSL2",
    "macOS",
    "JupyterHub",
    "not on a package index",
    "bubblewrap",
    "apt-get install bubblewrap",
    "cellbox doctor",
    "~/cellbox-lessons",
    "minutes",
)


def test_readme_and_the_docs_index_say_where_cellbox_runs_and_what_it_needs_first() -> None:
    from cellbox.lessons import DEFAULT_COPY

    assert f"~/{DEFAULT_COPY}" in BEFORE_THE_COMMANDS
    readme = README.read_text()
    head = " ".join(readme[: readme.index("```sh")].split())
    index = (ROOT / "docs" / "index.md").read_text()
    index_head = " ".join(index[: index.index("Start with the page for what you came to do")].split())
    for words in BEFORE_THE_COMMANDS:
        assert words in head, f"README.md: {words!r} comes after the first command, or not at all"
        assert words in index_head, f"docs/index.md: {words!r} comes after the page links, or not at all"
    # The tour of the modules is for later: after the reader has been sent to their page.
    assert "_launch.py" not in index_head
