"""What a student sees: the cellbox kernel in a real JupyterLab, in Debian's Chromium, driven by Playwright.

One JupyterLab server (127.0.0.1, a free port, a random token, its settings in a
temporary directory) and one headless Chromium serve the whole module; each test
opens its own notebook in a new browser context and reads the rendered page.
Screenshots of every state go to ``test-results/screenshots/`` (CI keeps
``test-results/``).

Needs ``chromium`` (Debian package), and the Python packages ``playwright`` and
``jupyterlab`` (the ``test`` extra); without them the tests are skipped with a
reason, or fail when ``CELLBOX_REQUIRE_ALL`` is set (CI).  Playwright never
downloads a browser here: it is pointed at ``/usr/bin/chromium``.
Select or skip them with ``-m browser`` / ``-m "not browser"``.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import REQUIRE_ALL_VARIABLE, require_all

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SCREENSHOTS = REPO / "test-results" / "screenshots"
LESSON = REPO / "lessons" / "01-separate-process.ipynb"
# A cell's printed text, and the value of its last expression (Out[n]), on the page.
STDOUT = '[data-mime-type="application/vnd.jupyter.stdout"]'
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'
RESULT = ".jp-OutputArea-executeResult .jp-OutputArea-output"
# Words of kernel internals a student must never have to read in a limit's error.
INTERNALS = ("Traceback", "cellbox/", "site-packages", "cellrunner", "ipykernel", 'File "')


def require_module(name: str, install: str) -> Any:
    """Import ``name`` or skip the test (fail it when ``CELLBOX_REQUIRE_ALL`` is set)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if require_all():
            pytest.fail(f"{name} is not installed and {REQUIRE_ALL_VARIABLE} is set; install it ({install}) in .ci/run")
        pytest.skip(f"{name} is not installed; install it ({install}) to run the browser tests")


@pytest.fixture(scope="module")
def chromium(require_tool: Callable[..., str]) -> str:
    """The path of Debian's Chromium, after checking that Playwright and JupyterLab are importable."""
    path = require_tool("chromium", install="apt-get install chromium")
    require_module("playwright.sync_api", "pip install -e '.[test]'")
    require_module("jupyterlab", "pip install -e '.[test]'")
    return path


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A JupyterLab server showing a fresh directory; stopped, with every kernel, after the module."""
    from browser.lab import running_lab

    root = tmp_path_factory.mktemp("lab-root")
    home = tmp_path_factory.mktemp("lab-home")
    with running_lab(root, home) as server:
        yield server


@pytest.fixture(scope="module")
def chrome(chromium: str) -> Iterator[Any]:
    """Headless Chromium (Debian's), started once for the module."""
    from playwright.sync_api import expect, sync_playwright

    from browser.notebook import EXPECT_TIMEOUT, launch_chromium

    expect.set_options(timeout=EXPECT_TIMEOUT)
    with sync_playwright() as playwright:
        chrome = launch_chromium(playwright, chromium)
        try:
            yield chrome
        finally:
            chrome.close()


@pytest.fixture
def page(chrome: Any, lab: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A new tab in a new browser context (no cookies or storage from other tests).

    When the test failed, what the tab showed last is saved as ``FAILED-<test>.png``.
    """
    from browser.notebook import VIEWPORT

    context = chrome.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    failed_before = request.session.testsfailed
    try:
        yield tab
    finally:
        if request.session.testsfailed > failed_before:  # counted as soon as the call failed
            tab.screenshot(path=str(_shot(f"FAILED-{request.node.name}")))
        context.close()
        lab.shutdown_kernels()


@pytest.fixture
def notebook(page: Any, lab: Any, request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``notebook(cells)``: write a notebook of these code cells for the cellbox kernel, and open it."""
    from browser.notebook import Notebook, write_notebook

    def open_notebook(sources: Sequence[str]) -> Notebook:
        name = f"{request.node.name}.ipynb"
        write_notebook(lab.root / name, sources)
        return Notebook(page, lab, name, SCREENSHOTS).open()

    return open_notebook


def text_of(locator: Any) -> str:
    return str(locator.inner_text())


def test_launcher_shows_cellbox_kernel_with_its_logo(page: Any, lab: Any) -> None:
    from playwright.sync_api import expect

    from browser.notebook import OPEN_TIMEOUT, natural_width

    page.goto(lab.page_url("lab/workspaces/launcher"))
    card = page.locator('.jp-LauncherCard[data-category="Notebook"][title="Python 3 (cellbox)"]')
    expect(card).to_be_visible(timeout=OPEN_TIMEOUT)
    expect(card.locator(".jp-LauncherCard-label")).to_have_text("Python 3 (cellbox)")
    logo = card.locator("img")
    assert "/kernelspecs/cellbox/" in str(logo.get_attribute("src"))
    width = natural_width(logo)
    page.screenshot(path=str(_shot("01-launcher")))
    assert width > 0, "the cellbox logo in the launcher did not load (a broken image)"


def test_printed_lines_appear_while_the_cell_runs(notebook: Callable[..., Any], lab: Any) -> None:
    from playwright.sync_api import expect

    flag = lab.root / "go-on.flag"
    # The cell waits for a file that the test creates only once the first line is on the page:
    # a kernel that sent the output in one lump at the end would never get past the wait.
    nb = notebook(
        [
            "import os, time\n"
            'print("first line: printed at once")\n'
            'while not os.path.exists("go-on.flag"):\n'
            "    time.sleep(0.05)\n"
            'print("second line: after the wait")'
        ]
    )
    nb.start(0)
    expect(nb.output(0)).to_contain_text("first line: printed at once")
    expect(nb.prompt(0)).to_have_text(re.compile(r"\[\*\]"))
    assert "second line" not in text_of(nb.output(0))
    nb.screenshot("02-output-while-running", 0)
    flag.touch()
    nb.wait_until_done(0)
    expect(nb.output(0)).to_contain_text("second line: after the wait")
    assert text_of(nb.output(0)).splitlines() == ["first line: printed at once", "second line: after the wait"]


def test_plot_appears_as_an_image(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    from browser.notebook import natural_width

    nb = notebook(
        [
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3, 4], [1, 4, 9, 16], marker='o')\n"
            "plt.title('squares')\n"
            "plt.show()"
        ]
    )
    output = nb.run(0, timeout=90_000)  # the first plot of a session builds matplotlib's font cache
    image = output.locator(".jp-RenderedImage img")
    expect(image).to_be_visible()
    nb.screenshot("03-plot", 0)
    assert str(image.get_attribute("src")).startswith("data:image/png;base64,")
    assert natural_width(image) > 200


def test_wall_limit_stops_an_endless_loop_with_a_plain_message(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(["%%limits wall=2\nwhile True:\n    pass", 'print("the kernel is still here")'])
    output = nb.run(0)
    expect(output).to_contain_text("CellTimeoutError")
    nb.screenshot("04-wall-limit", 0)
    message = text_of(output)
    assert "2 s wall-clock limit" in message
    assert "%%limits wall=" in message  # what to do if the cell really needs longer
    for word in INTERNALS:
        assert word not in message, f"the limit error shows kernel internals ({word!r}):\n{message}"
    expect(nb.run(1)).to_have_text("the kernel is still here")


def test_interrupt_button_stops_a_sleeping_cell_and_the_next_cell_runs(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(['import time\nprint("going to sleep")\ntime.sleep(60)\nprint("woke up")', 'print("next cell ran")'])
    nb.start(0)
    expect(nb.output(0)).to_contain_text("going to sleep")
    nb.interrupt()
    nb.wait_until_done(0, timeout=20_000)
    expect(nb.output(0)).to_contain_text("KeyboardInterrupt")
    nb.screenshot("05-interrupted", 0)
    message = text_of(nb.output(0))
    assert "woke up" not in text_of(nb.output(0).locator(STDOUT))
    for word in ("cellbox/", "site-packages", "cellrunner", "ipykernel"):
        assert word not in message, f"the interrupted cell shows kernel internals ({word!r}):\n{message}"
    expect(nb.run(1)).to_have_text("next cell ran")
    nb.screenshot("06-after-interrupt", 1)


def test_input_box_takes_the_answer_to_the_cell(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(['name = input("What is your name? ")\nprint(f"Hello, {name}!")'])
    nb.start(0)
    box = nb.output(0).locator("input.jp-Stdin-input")
    expect(box).to_be_visible()
    expect(nb.output(0)).to_contain_text("What is your name?")
    box.fill("Ada")
    nb.screenshot("07-input-box", 0)
    box.press("Enter")
    nb.wait_until_done(0)
    expect(nb.output(0)).to_contain_text("Hello, Ada!")
    nb.screenshot("08-input-answered", 0)


def test_interrupting_input_says_so_without_kernel_internals(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(['answer = input("Type something: ")', 'print("next cell ran")'])
    nb.start(0)
    expect(nb.output(0).locator("input.jp-Stdin-input")).to_be_visible()
    nb.interrupt()
    nb.wait_until_done(0, timeout=20_000)
    expect(nb.output(0)).to_contain_text("KeyboardInterrupt")
    nb.screenshot("09-input-interrupted", 0)
    message = text_of(nb.output(0).locator(STDERR))
    for word in ("cellbox/", "cellrunner", "Channel", "readline"):
        assert word not in message, f"the interrupted input() shows kernel internals ({word!r}):\n{message}"
    assert "Interrupted by user" in message
    expect(nb.run(1)).to_have_text("next cell ran")


def test_variables_carry_from_cell_to_cell_until_the_restart_button(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(
        [
            'scores = {"ada": 9, "bob": 7}\n\ndef double(n):\n    return 2 * n',
            'scores["bob"] += 1\ndouble(scores["ada"]), scores',
            'print("scores" in globals())',
        ]
    )
    nb.run(0)
    expect(nb.run(1).locator(RESULT)).to_have_text("(18, {'ada': 9, 'bob': 8})")
    expect(nb.run(2)).to_have_text("True")
    nb.screenshot("10-variables-carried", 1)
    nb.restart()
    expect(nb.run(2)).to_have_text("False")  # a restart forgets every name, as in any kernel
    expect(nb.prompt(2)).to_have_text("[1]:")
    nb.screenshot("11-after-restart", 2)


def test_lesson_notebook_runs_and_its_check_gives_friendly_feedback(page: Any, lab: Any) -> None:
    from playwright.sync_api import expect

    from browser.notebook import Notebook

    cells = lesson_cells(LESSON)
    shutil.copy(LESSON, lab.root / LESSON.name)
    nb = Notebook(page, lab, LESSON.name, SCREENSHOTS).open()
    expect(nb.panel.locator(".jp-Toolbar-kernelName")).to_contain_text("Python 3 (cellbox)")
    nb.screenshot("12-lesson-opened")
    nb.run(cells["setup"])  # hidden: the check helpers
    expect(nb.run(cells["demo"])).to_contain_text("returncode: 0")
    nb.screenshot("13-lesson-demo", cells["demo"])
    nb.run(cells["exercise"])  # the scaffold, not done yet
    expect(nb.run(cells["check"])).to_contain_text("not done yet")
    nb.screenshot("14-lesson-check", cells["check"])


def lesson_cells(path: Path) -> dict[str, int]:
    """Indices of a lesson's cells by role: its set-up cell, first ``subprocess.run`` demo, first exercise and check.

    Found by the tags the lesson build writes (``setup``, ``exercise``, ``check``), so the
    test follows the lesson when its text changes.
    """
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]

    def first(role: Callable[[dict[str, Any]], bool], after: int = -1) -> int:
        return next(n for n, cell in enumerate(cells) if n > after and role(cell))

    def tagged(tag: str) -> Callable[[dict[str, Any]], bool]:
        return lambda cell: tag in cell.get("metadata", {}).get("tags", [])

    exercise = first(tagged("exercise"))
    return {
        "setup": first(tagged("setup")),
        "demo": first(lambda cell: cell["cell_type"] == "code" and "subprocess.run(" in "".join(cell["source"])),
        "exercise": exercise,
        "check": first(tagged("check"), after=exercise),
    }


def test_a_slider_moved_in_the_page_runs_its_callback_and_shows_the_output(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(
        [
            "from ipywidgets import interact\n"
            "def square(x):\n"
            "    print(f'{x} squared is {x * x}')\n"
            "_ = interact(square, x=(0, 10))",
            "print('last value:', _.widget.kwargs['x'])",
        ]
    )
    nb.start(0)
    nb.wait_until_done(0, timeout=90_000)
    # interact's own Output widget, inside the cell's output area.
    output = nb.cell(0).locator(".jupyter-widgets .jp-OutputArea")
    expect(output).to_contain_text("5 squared is 25")
    handle = nb.cell(0).locator(".widget-slider .noUi-handle")
    expect(handle).to_be_visible()
    handle.focus()
    handle.press("ArrowRight")
    # The move is a comm message, run forked from the session's state; the Output widget shows what it printed.
    expect(output).to_contain_text("6 squared is 36")
    nb.screenshot("15-slider-moved", 0)
    assert "5 squared is 25" not in text_of(output)
    # The callback's state is the next cell's.
    expect(nb.run(1)).to_contain_text("last value: 6")  # its one output area: no widget in it


def test_a_tqdm_bar_and_an_ipympl_figure_are_drawn_as_widgets(notebook: Callable[..., Any]) -> None:
    from playwright.sync_api import expect

    nb = notebook(
        [
            "from tqdm.auto import tqdm\nfor _ in tqdm(range(5), desc='steps'):\n    pass",
            "%matplotlib widget\nimport matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 4, 2])\nplt.show()",
        ]
    )
    nb.start(0)
    nb.wait_until_done(0, timeout=90_000)
    bar = nb.cell(0).locator(".widget-hprogress")
    expect(bar).to_be_visible()
    expect(nb.cell(0).locator(".widget-html").first).to_contain_text("steps")
    nb.start(1)
    nb.wait_until_done(1, timeout=90_000)
    # ipympl's figure: a canvas the frontend draws from the image the kernel sends (a binary buffer).
    canvas = nb.cell(1).locator(".jupyter-matplotlib-canvas-div canvas").first
    expect(canvas).to_be_visible()
    painted = "c => c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v, i) => i % 4 == 3 && v > 0)"
    deadline = time.monotonic() + 60
    while not canvas.evaluate(painted) and time.monotonic() < deadline:
        time.sleep(0.2)
    nb.screenshot("16-tqdm-and-ipympl", 1)
    assert canvas.evaluate(painted), "ipympl's canvas stayed blank: the figure's image did not arrive"


def _shot(name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / f"{name}.png"


def test_debugger_stops_at_a_breakpoint_and_shows_the_variables(notebook: Callable[..., Any]) -> None:
    """The bug button turns the debugger on, a click in the gutter sets a breakpoint, the variables panel reads."""
    from playwright.sync_api import expect

    nb = notebook(["first = 20\nsecond = first * 2\nprint(second)"])
    page = nb.page
    bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton")
    expect(bug).to_be_enabled()  # the kernelspec and kernel_info offer the debugger
    bug.click()
    expect(bug).to_have_attribute("aria-pressed", "true")
    sidebar = page.locator("#jp-debugger-sidebar")
    if not sidebar.is_visible():
        page.locator('.jp-SideBar.jp-mod-right [data-id="jp-debugger-sidebar"]').click()
    expect(sidebar).to_be_visible()
    cell = nb.cell(0)
    gutter = cell.locator("div.cm-gutter.cm-breakpoint-gutter")
    expect(gutter).to_be_visible()
    line = cell.locator(".cm-line").nth(1).bounding_box()
    box = gutter.bounding_box()
    assert line is not None and box is not None
    page.mouse.click(box["x"] + box["width"] / 2, line["y"] + line["height"] / 2)
    expect(sidebar.locator(".jp-DebuggerBreakpoints")).to_contain_text("2")  # the panel lists line 2
    nb.start(0)
    variables = sidebar.locator(".jp-DebuggerVariables")
    expect(variables).to_contain_text("first")
    expect(variables).to_contain_text("20")
    expect(cell.locator(".jp-DebuggerEditor-highlight").first).to_be_visible()  # the stopped line
    assert "second" not in text_of(variables)  # line 2 has not run yet
    nb.screenshot("15-debugger-stopped", 0)
    sidebar.locator('[title^="Continue"]').first.click()
    nb.wait_until_done(0)
    expect(nb.output(0)).to_contain_text("40")
    nb.screenshot("16-debugger-continued", 0)
