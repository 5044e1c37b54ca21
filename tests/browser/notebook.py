"""Drive a notebook in JupyterLab the way a student does: click a cell, press a key, read the page.

Everything here reads the rendered page (the DOM JupyterLab 4 builds), never the
kernel's messages: what the test checks is what a student sees.  Selectors are
JupyterLab 4's class names and command ids (``notebook:interrupt-kernel``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Locator, Page, expect

from .lab import JupyterLab

# The flags the browser test starts Debian's Chromium with: no sandbox (CI runs as
# root), no GPU (headless), and no traffic of its own (updates, sync, QUIC probes).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 860}
# Milliseconds the page may take to show a notebook and start its kernel, and a cell to finish
# (a cell starts a fresh Python: about a second on a busy 2-core machine; a first plot builds a font cache).
OPEN_TIMEOUT = 60_000
CELL_TIMEOUT = 45_000
# Milliseconds any other expectation on the page may wait (Playwright's default, 5 s, is short on a busy machine).
EXPECT_TIMEOUT = 20_000
KERNEL = {"display_name": "Python 3 (cellbox)", "language": "python", "name": "cellbox"}
DONE_PROMPT = re.compile(r"\[\d+\]")
RUNNING_PROMPT = re.compile(r"\[\*\]")


def write_notebook(path: Path, sources: Sequence[str], kernel: dict[str, str] = KERNEL) -> Path:
    """Write a notebook (nbformat 4.5) with one code cell per source, for the ``cellbox`` kernel."""
    cells = [
        {"cell_type": "code", "execution_count": None, "id": f"cell-{n}", "metadata": {}, "outputs": [], "source": s}
        for n, s in enumerate(sources)
    ]
    notebook = {
        "cells": cells,
        "metadata": {"kernelspec": kernel, "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    return path


class Notebook:
    """One notebook open in a browser tab.

    Args:
        page: the Playwright page (tab) to use.
        lab: the server.
        name: the notebook's path under the server's root.
        screenshots: the directory :meth:`screenshot` writes to.
    """

    def __init__(self, page: Page, lab: JupyterLab, name: str, screenshots: Path) -> None:
        self.page = page
        self.lab = lab
        self.name = name
        self.screenshots = screenshots

    def open(self) -> Notebook:
        """Open the notebook and wait until its kernel is idle (started and answering).

        The page uses a workspace of its own, named after the notebook: JupyterLab
        reopens the tabs of its workspace, and the notebooks of earlier tests
        would otherwise come back, each starting its kernel again.
        """
        self.page.goto(self.lab.page_url(f"lab/workspaces/{workspace_name(self.name)}/tree/{self.name}"))
        expect(self.panel.locator(".jp-Notebook .jp-Cell").first).to_be_visible(timeout=OPEN_TIMEOUT)
        self.wait_for_idle_kernel()
        return self

    @property
    def panel(self) -> Locator:
        """The notebook's panel: its toolbar and its cells."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")

    def wait_for_idle_kernel(self) -> None:
        """Wait until the status bar says ``Python 3 (cellbox) | Idle``: the kernel started and answered.

        (The toolbar's execution indicator says ``idle`` before the kernel even
        exists, and a cell run then is lost.)
        """
        status = self.page.locator("#jp-main-statusbar")
        expect(status).to_contain_text(f"{KERNEL['display_name']} | Idle", timeout=OPEN_TIMEOUT)

    def cell(self, index: int) -> Locator:
        """The ``index``-th cell (from 0)."""
        return self.panel.locator(".jp-Notebook .jp-Cell").nth(index)

    def prompt(self, index: int) -> Locator:
        """The cell's input prompt: ``[ ]:`` before, ``[*]:`` while it runs, ``[3]:`` after."""
        return self.cell(index).locator(".jp-InputPrompt")

    def output(self, index: int) -> Locator:
        """The cell's output area."""
        return self.cell(index).locator(".jp-OutputArea")

    def start(self, index: int) -> None:
        """Run the cell as a student does: click into it and press Ctrl+Enter (run, stay on the cell).

        A cell whose source is hidden (a lesson's set-up cell) is selected by a
        click beside it, in the margin where the prompt would be.
        """
        cell = self.cell(index)
        cell.scroll_into_view_if_needed()
        editor = cell.locator(".jp-InputArea-editor")
        if editor.is_visible():
            editor.click()
        else:
            cell.click(position={"x": 40, "y": 8})
        self.page.keyboard.press("Control+Enter")
        expect(self.prompt(index)).not_to_have_text("[ ]:", timeout=CELL_TIMEOUT)

    def run(self, index: int, timeout: float = CELL_TIMEOUT) -> Locator:
        """Run the cell, wait until it has finished (its prompt shows a number) and return its output area."""
        self.start(index)
        self.wait_until_done(index, timeout)
        return self.output(index)

    def wait_until_done(self, index: int, timeout: float = CELL_TIMEOUT) -> None:
        """Wait until the cell's prompt shows its execution count."""
        expect(self.prompt(index)).to_have_text(DONE_PROMPT, timeout=timeout)

    def interrupt(self) -> None:
        """Click the toolbar's interrupt button (the square)."""
        self.panel.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()

    def restart(self) -> None:
        """Click the toolbar's restart button, confirm the dialog, and wait until the new kernel is idle.

        The status bar may still say ``Idle`` for a moment after the click, so the
        wait starts once the server runs a new kernel process: by then the page
        has marked the kernel as restarting.
        """
        before = self.lab.kernel_pids()
        self.panel.locator('.jp-NotebookPanel-toolbar [data-command="notebook:restart-kernel"]').click()
        self.page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
        deadline = time.monotonic() + OPEN_TIMEOUT / 1000
        while not self.lab.kernel_pids() - before:
            if time.monotonic() > deadline:
                raise AssertionError(f"no new kernel process within {OPEN_TIMEOUT / 1000:g} s of the restart")
            time.sleep(0.1)
        self.wait_for_idle_kernel()

    def screenshot(self, name: str, index: int | None = None) -> Path:
        """Save what the tab shows now, with cell ``index`` scrolled into view, as ``NAME.png``."""
        if index is not None:
            self.cell(index).scroll_into_view_if_needed()
        self.screenshots.mkdir(parents=True, exist_ok=True)
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


def workspace_name(path: str) -> str:
    """A JupyterLab workspace name for ``path``: letters, digits and dashes."""
    return re.sub(r"[^A-Za-z0-9]+", "-", path).strip("-") or "default"


def natural_width(image: Locator) -> int:
    """The width in pixels of the picture an ``<img>`` loaded; 0 when it did not load (a broken image)."""
    image.evaluate("img => img.decode ? img.decode().catch(() => null) : null")
    return int(image.evaluate("img => img.complete ? img.naturalWidth : 0"))


def launch_chromium(playwright: Any, executable: str = CHROMIUM) -> Browser:
    """Start Debian's Chromium headless with :data:`CHROMIUM_ARGS`; Playwright gives it a new, empty profile."""
    browser: Browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
    return browser
