"""Build the lesson notebooks from their sources: ``python lessons/build.py [--check]``.

Each lesson is written once, as ``lessons/src/lessonNN.py``: a script of calls to the small vocabulary below.

* ``lesson(number, slug, title)``: starts the lesson (``NN-slug.ipynb``).
* ``md(text)``: a Markdown cell.
* ``code(src, tags=())``: a worked code cell; tag ``raises-exception`` when it is meant to fail.  Worked cells
  and check cells are also tagged ``skip-grading``: when ``cellbox grade`` turns a notebook into a module, only
  the setup cell and the exercises (each self-contained) are kept, so importing it is quick and quiet.
* ``exercise(name, src)``: a function the student completes.  The lines between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` are the solution; the student's copy has ``# YOUR CODE HERE`` and
  ``raise NotImplementedError`` there instead.
* ``check(name, src)``: a check cell for exercise ``name`` (it calls the helpers of lessonkit.py).
* ``answers(text)``: a Markdown cell in the solutions notebook only: the answers to "Try this next".
* ``hashed(name, answers)``: the source of a dict ``{key: digest}`` of the answers of a "predict" exercise, for its
  check cell: the check compares digests (lessonkit.digest), so reading the cell gives no answer away.
* ``sealed(name, hints)``: the source of a dict of hints ``{(key, wrong answer): text}``, each sealed with its wrong
  answer (lessonkit.seal): the check shows one with lessonkit.unseal once the student gave that answer, and reading
  the cell tells neither which answers are wrong (no answer found by elimination) nor what the hints say.

The build writes two notebooks per lesson: ``lessons/NN-slug.ipynb`` for students and
``lessons/solutions/NN-slug.ipynb`` with the solutions filled in.  Both are nbformat 4, carry the ``cellbox``
kernelspec, have no outputs and stable cell ids, and start with a hidden setup cell holding lessonkit.py.
``--check`` writes nothing and exits 1 when a committed notebook differs from what the build makes.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
SOLUTIONS = HERE / "solutions"
KERNELSPEC = {"name": "cellbox", "display_name": "Python 3 (cellbox)", "language": "python"}
LANGUAGE_INFO = {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"}
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
TODO = "# YOUR CODE HERE\nraise NotImplementedError"
_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class Cell:
    kind: str  # "markdown" or "code"
    id: str
    student: str
    solution: str
    tags: tuple[str, ...] = ()
    hidden: bool = False
    solutions_only: bool = False


@dataclass
class Lesson:
    number: int
    slug: str
    title: str
    cells: list[Cell] = field(default_factory=list)
    exercises: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return f"{self.number:02d}-{self.slug}.ipynb"

    def add(self, kind: str, base_id: str, student: str, solution: str | None = None, **extra) -> None:
        cell_id = _ID_SAFE.sub("-", base_id)[:64]
        taken = {c.id for c in self.cells}
        n = 2
        while cell_id in taken:
            cell_id = f"{_ID_SAFE.sub('-', base_id)[:60]}-{n}"
            n += 1
        text = _clean(student)
        self.cells.append(Cell(kind, cell_id, text, _clean(solution) if solution is not None else text, **extra))


def _clean(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def split_solution(src: str) -> tuple[str, str, list[str]]:
    """Return (student source, solution source, solution lines) of an exercise cell.

    Raises:
        ValueError: the markers are missing or unbalanced.
    """
    student: list[str] = []
    solution: list[str] = []
    hidden: list[str] = []
    inside = False
    for line in _clean(src).splitlines():
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            student.extend(indent + todo for todo in TODO.splitlines())
            continue
        if marker == END:
            if not inside:
                raise ValueError(f"{END} without {BEGIN}")
            inside = False
            continue
        solution.append(line)
        if inside:
            hidden.append(line)
        else:
            student.append(line)
    if inside or not hidden:
        raise ValueError(f"an exercise needs one {BEGIN} ... {END} block")
    return "\n".join(student), "\n".join(solution), hidden


def load(path: Path) -> Lesson:
    """Run one lesson source and return the Lesson it describes."""
    state: dict[str, Lesson] = {}

    def current() -> Lesson:
        if "lesson" not in state:
            raise ValueError(f"{path.name}: call lesson(...) first")
        return state["lesson"]

    def lesson(number: int, slug: str, title: str) -> None:
        state["lesson"] = Lesson(number, slug, title)
        setup = (HERE / "lessonkit.py").read_text()
        header = "# Setup: the check helpers used by the check cells (run it; no need to read it).\n"
        state["lesson"].add("code", "setup", header + setup, tags=("setup",), hidden=True)

    def md(text: str) -> None:
        current().add("markdown", f"md-{len(current().cells)}", text)

    def code(src: str, tags: tuple[str, ...] | list[str] = ()) -> None:
        current().add("code", f"code-{len(current().cells)}", src, tags=(*tags, "skip-grading"))

    def exercise(name: str, src: str) -> None:
        student, solution, _ = split_solution(src)
        current().add("code", f"exercise-{name}", student, solution, tags=("exercise",))
        current().exercises.append(name)

    def check(name: str, src: str) -> None:
        current().add("code", f"check-{name}", src, tags=("check", "skip-grading"))

    def answers(text: str) -> None:
        current().add("markdown", "answers", text, solutions_only=True)

    def hashed(name: str, answers: dict) -> str:
        return "{" + ", ".join(f"{key!r}: {digest(name, key, value)!r}" for key, value in answers.items()) + "}"

    def sealed(name: str, hints: dict) -> str:
        boxes = (kit()["seal"](name, key, value, text) for (key, value), text in hints.items())
        return "{" + ", ".join(f"{index!r}: {box!r}" for index, box in boxes) + "}"

    namespace = {"lesson": lesson, "md": md, "code": code, "exercise": exercise, "check": check, "answers": answers,
                 "hashed": hashed, "sealed": sealed, "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return current()


def kit() -> dict:
    """lessonkit.py's names, read from the file the notebooks embed, so the build and the checks never disagree."""
    names: dict = {}
    exec(compile((HERE / "lessonkit.py").read_text(), "lessonkit.py", "exec"), names)
    return names


def digest(exercise: str, key: str, value: object) -> str:
    """lessonkit.digest of one answer."""
    return kit()["digest"](exercise, key, value)


def notebook(lesson: Lesson, solutions: bool) -> nbformat.NotebookNode:
    """The lesson as a notebook: the student's copy, or the solutions."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": dict(LANGUAGE_INFO)}
    for cell in lesson.cells:
        if cell.solutions_only and not solutions:
            continue
        source = cell.solution if solutions else cell.student
        if cell.kind == "markdown":
            new = nbformat.v4.new_markdown_cell(source)
        else:
            new = nbformat.v4.new_code_cell(source)
        new.id = cell.id
        metadata: dict = {}
        if cell.tags:
            metadata["tags"] = list(cell.tags)
        if cell.hidden:
            metadata["jupyter"] = {"source_hidden": True}
        new.metadata = metadata
        nb.cells.append(new)
    nbformat.validate(nb)
    return nb


def lessons() -> list[Lesson]:
    """Every lesson, in order."""
    return [load(path) for path in sorted(SOURCES.glob("lesson[0-9][0-9].py"))]


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def build() -> dict[Path, str]:
    """Every notebook the build writes, as {path: text}."""
    files: dict[Path, str] = {}
    for item in lessons():
        files[HERE / item.filename] = render(notebook(item, solutions=False))
        files[SOLUTIONS / item.filename] = render(notebook(item, solutions=True))
    return files


def main(argv: list[str]) -> int:
    files = build()
    if "--check" in argv:
        stale = [str(p.relative_to(HERE)) for p, text in files.items() if not p.exists() or p.read_text() != text]
        for name in stale:
            print(f"out of date: lessons/{name} (run: python lessons/build.py)")
        return 1 if stale else 0
    SOLUTIONS.mkdir(exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    print(json.dumps({"notebooks": len(files)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
