"""Reports of a grading run: ``grades.csv``, ``junit.xml`` and ``report.html`` (``results.json`` is the runner's).

* ``grades.csv``: one row per submission: ``id, verdict, passed, failed,
  errors, total, score`` (score in percent, 0-100), ready for a gradebook
  import; an id a spreadsheet would run as a formula (``=``, ``+``, ``-``,
  ``@``, tab, carriage return first) gets a ``'`` in front.
* ``junit.xml``: one ``<testsuite>`` per submission, one ``<testcase>`` per
  instructor test (the JUnit XML that Jenkins' ``junit`` step reads); a run
  without a test record gets one ``grading`` test case carrying the reason.
* ``report.html``: one self-contained page (inline CSS and SVG, no script, no
  network): a bar chart of verdicts, the pass rate of each test, and a row per
  submission, and each failing test's message.  Verdict colours come from
  :data:`cellbox.verdict.COLOURS`, by exact value.

The counts are the same in every report (:class:`~cellbox.grading.results.SubmissionResult`:
a run that is not ``verified`` or ``failed`` carries one ``grading.verdict``
error).  Every text is written as UTF-8; bytes of a name that are not UTF-8
are written as ``\\xNN`` (:func:`clean`).
"""

from __future__ import annotations

import csv
import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ..verdict import COLOURS, Verdict
from .results import SubmissionResult

__all__ = ["write_reports", "write_csv", "write_junit", "write_html", "clean", "csv_cell", "CSV_FIELDS"]

CSV_FIELDS = ("id", "verdict", "passed", "failed", "errors", "skipped", "not_run", "total", "score")
# What the counts of every report mean (grades.csv, junit.xml, report.html, the terminal).
COUNTS_MEANING = (
    "each instructor test counted once, as passed (xpassed too), failed (a strict xpass too), errors (a fixture's"
    " setup or teardown failed), skipped (xfailed too) or not_run (never finished); total = the instructor tests;"
    " score = passed / (total - skipped), and 0 unless verified or failed"
)
# Characters XML 1.0 does not allow, even escaped (the spec's "Char" production).
_XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet cell a formula (OWASP CSV injection)


def clean(text: str) -> str:
    """``text`` as writable UTF-8: a byte that was not UTF-8 (a surrogate escape from a file name) becomes ``\\xNN``."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that is not an escaped byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def csv_cell(text: str) -> str:
    """A text cell of ``grades.csv``: clean, and never a formula (``=HYPERLINK(...)`` becomes ``'=HYPERLINK(...)``)."""
    text = clean(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


def write_reports(out: Path, results: list[SubmissionResult], header: dict[str, Any] | None = None) -> list[Path]:
    """Write ``grades.csv``, ``junit.xml`` and ``report.html`` into ``out``; return their paths.

    ``header`` (the run's ``results.json`` header: tests, limits, isolation) is summed up in the HTML page.
    """
    return [
        write_csv(out / "grades.csv", results),
        write_junit(out / "junit.xml", results),
        write_html(out / "report.html", results, header),
    ]


def write_csv(path: Path, results: list[SubmissionResult]) -> Path:
    """One row per submission (:data:`CSV_FIELDS`)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_FIELDS)
        for result in results:
            writer.writerow(
                [
                    csv_cell(result.id),
                    result.verdict.value,
                    result.passed,
                    result.failed,
                    result.errors,
                    result.skipped,
                    result.not_run,
                    result.total,
                    f"{result.score:.2f}",
                ]
            )
    return path


def _xml_text(text: str) -> str:
    return _XML_INVALID.sub("\ufffd", clean(text))


def _headline(message: str) -> str:
    """The first ``E   ...`` line of a pytest failure (the assertion), else its last line."""
    lines = [line for line in message.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    return (errors or lines or ["failed"])[0 if errors else -1]


def _testcase(suite: ET.Element, classname: str, name: str, seconds: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=_xml_text(classname), name=_xml_text(name), time=f"{seconds:.3f}")


def _junit_suite(root: ET.Element, result: SubmissionResult) -> None:
    suite = ET.SubElement(root, "testsuite", name=_xml_text(result.id))
    properties = ET.SubElement(suite, "properties")
    for key, value in (
        ("verdict", result.verdict.value),
        ("reason", result.reason),
        ("score", f"{result.score}"),
        ("counts", COUNTS_MEANING),
    ):
        ET.SubElement(properties, "property", name=key, value=_xml_text(value))
    for test in result.tests:
        module, _, name = test.nodeid.partition("::")
        case = _testcase(
            suite, f"{result.id}.{module.removesuffix('.py').replace('/', '.')}", name or module, test.duration
        )
        text = _xml_text(test.message or test.outcome)
        if test.outcome == "failed":
            ET.SubElement(case, "failure", message=_xml_text(_headline(test.message))).text = text
        elif test.outcome in ("skipped", "xfailed"):
            ET.SubElement(case, "skipped", message=_xml_text(test.outcome))
        elif test.outcome not in ("passed", "xpassed"):
            ET.SubElement(case, "error", message=_xml_text(f"{test.outcome}: {result.reason}")).text = text
        if test.output:
            ET.SubElement(case, "system-out").text = _xml_text(test.output)
    if result.verdict_entry:
        case = _testcase(suite, f"{result.id}.grading", "verdict", result.duration)
        ET.SubElement(case, "error", message=_xml_text(f"{result.verdict.label}: {result.reason}"))
    # The counts of its test cases: the instructor tests (not run ones as errors) and the verdict case.
    counts = {
        "tests": result.total + result.verdict_entry,
        "failures": result.failed,
        "errors": result.errors + result.not_run + result.verdict_entry,
        "skipped": result.skipped,
    }
    for key, count in counts.items():
        suite.set(key, str(count))
    suite.set("time", f"{result.duration:.3f}")


def write_junit(path: Path, results: list[SubmissionResult]) -> Path:
    """JUnit XML: ``<testsuites>`` with one ``<testsuite>`` per submission."""
    root = ET.Element("testsuites", name="cellbox grade")
    for result in results:
        _junit_suite(root, result)
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


# ---------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#1f2328}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:2em}
table{border-collapse:collapse;margin-top:.5em} td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left}
th{background:#f6f8fa} td.num{text-align:right}
.verdict{font-weight:bold;color:#fff;padding:.1em .4em;border-radius:3px;white-space:nowrap}
svg text{font-size:12px;font-family:system-ui,sans-serif}
td.test{word-break:break-all;max-width:40em} .bar{display:inline-block;width:300px;height:1em;background:#eaeef2}
.bar span{display:block;height:100%;background:#0969da}
pre{background:#f6f8fa;padding:.5em;white-space:pre-wrap} summary{cursor:pointer}
"""


def _badge(verdict: Verdict) -> str:
    return f'<span class="verdict" style="background:{COLOURS[verdict]}">{html.escape(verdict.label)}</span>'


def _verdict_chart(results: list[SubmissionResult]) -> str:
    counts = {verdict: sum(1 for r in results if r.verdict is verdict) for verdict in Verdict}
    most = max(counts.values()) or 1
    rows = []
    for index, (verdict, count) in enumerate(counts.items()):
        y = 10 + index * 28
        width = 300 * count / most
        rows.append(
            f'<text x="0" y="{y + 15}">{html.escape(verdict.label)}</text>'
            f'<rect x="140" y="{y}" width="{width:.1f}" height="20" fill="{COLOURS[verdict]}"/>'
            f'<text x="{146 + width:.1f}" y="{y + 15}">{count}</text>'
        )
    height = 20 + 28 * len(counts)
    return (
        f'<svg role="img" aria-label="verdicts" width="500" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>'
    )


def _pass_rates(results: list[SubmissionResult]) -> dict[str, tuple[int, int]]:
    """Per test: passes in ``verified``/``failed`` runs, over every graded submission (not collected counts too)."""
    nodeids = {test.nodeid for result in results for test in result.tests}
    rates = dict.fromkeys(nodeids, (0, len(results)))
    for result in results:
        if result.verdict not in (Verdict.VERIFIED, Verdict.FAILED):
            continue  # passes without a complete record are not counted, as in the score
        for test in result.tests:
            passed, total = rates[test.nodeid]
            rates[test.nodeid] = (passed + (test.outcome in ("passed", "xpassed")), total)
    return rates


def _rate_chart(results: list[SubmissionResult]) -> str:
    """The pass rate of each test: a table with the whole test id, a bar and the count (the id wraps, never cut)."""
    rates = _pass_rates(results)
    if not rates:
        return "<p>No test reported a result.</p>"
    rows = []
    for nodeid, (passed, total) in sorted(rates.items()):
        share = 100 * passed / total if total else 0.0
        rows.append(
            f'<tr class="rate"><td class="test"><code>{html.escape(nodeid)}</code></td>'
            f'<td><span class="bar" role="img" aria-label="{share:.0f}%"><span style="width:{share:.1f}%"></span>'
            f'</span></td><td class="num">{passed}/{total} ({share:.0f}%)</td></tr>'
        )
    return f'<table class="rates" aria-label="pass rate per test">{"".join(rows)}</table>'


def _table(results: list[SubmissionResult]) -> str:
    head = "".join(
        f"<th>{name}</th>"
        for name in (
            "id",
            "verdict",
            "passed",
            "failed",
            "errors",
            "skipped",
            "not run",
            "total",
            "score",
            "seconds",
            "reason",
        )
    )
    rows = []
    for r in results:
        numbers = "".join(
            f'<td class="num">{value}</td>'
            for value in (
                r.passed,
                r.failed,
                r.errors,
                r.skipped,
                r.not_run,
                r.total,
                f"{r.score:.2f}",
                f"{r.duration:.2f}",
            )
        )
        rows.append(
            f"<tr><td>{html.escape(clean(r.id))}</td><td>{_badge(r.verdict)}</td>{numbers}"
            f"<td>{html.escape(clean(r.reason))}</td></tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table><p>Counts: {html.escape(COUNTS_MEANING)}.</p>"


def _failures(results: list[SubmissionResult]) -> str:
    """Each failing test's message, escaped, per submission (no script: ``<details>`` opens without one)."""
    parts = []
    for result in results:
        for test in result.tests:
            if test.outcome in ("passed", "xpassed", "skipped", "xfailed"):
                continue
            summary = f"{html.escape(clean(result.id))}: {html.escape(clean(test.nodeid))} ({test.outcome})"
            parts.append(
                f"<details><summary>{summary}</summary>"
                f"<pre>{html.escape(clean(test.message or test.outcome))}</pre></details>"
            )
    return "".join(parts) or "<p>No test failed.</p>"


def _setup(header: dict[str, Any] | None) -> str:
    if not header:
        return ""
    limits = header.get("limits") or {}
    parts = [
        f"tests: {header.get('tests')}",
        f"wall {limits.get('wall_time')} s, cpu {limits.get('cpu_time')} s",
        str(header.get("isolation", "")),
    ]
    return f"<p>{html.escape(' · '.join(part for part in parts if part))}</p>"


def write_html(path: Path, results: list[SubmissionResult], header: dict[str, Any] | None = None) -> Path:
    """A self-contained HTML summary (no script, no external resource)."""
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>cellbox grade report</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>cellbox grade: {len(results)} submissions</h1>{_setup(header)}"
        f"<h2>Verdicts</h2>{_verdict_chart(results)}"
        f"<h2>Submissions</h2>{_table(results)}"
        f"<h2>Pass rate per test</h2>{_rate_chart(results)}"
        f"<h2>Failing tests</h2>{_failures(results)}"
        "</body></html>\n"
    )
    path.write_text(clean(page), encoding="utf-8")
    return path
