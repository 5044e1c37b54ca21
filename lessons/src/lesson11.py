lesson(11, "the-three-state-verdict", "The three-state verdict")

md("""
# Lesson 11: the three-state verdict

**Goal:** decide honestly whether a submission passed its tests: `verified` only on positive evidence, and
`failed`, `unverified` or `timed_out` otherwise.

**The plan.** We run pytest on small submissions and read its **exit codes**: 0, 1, 2, 5 mean very different
things. A submission that never got as far as the tests proves nothing, so "did not fail" is not "passed". Then two
traps: a status page that colours labels by substring (and paints `TESTS UNVERIFIED` green), and a submission
that fakes exit 0 with `os._exit(0)`. The fix for the second is **evidence**: a report of which tests ran and
passed, written by something we control.

```mermaid
flowchart TD
    R[pytest run] --> T{"wall deadline passed?"}
    T -- yes --> TO[timed_out]
    T -- no --> E{"evidence: every expected<br/>test ran in this run?"}
    E -- no --> U[unverified]
    E -- yes --> X{"exit 0 and all passed?"}
    X -- yes --> V[verified]
    X -- "no: exit 1, some failed" --> F[failed]
```
""")

md("""
## 1. pytest's exit codes

| exit | meaning |
| --- | --- |
| 0 | all collected tests passed |
| 1 | some tests failed |
| 2 | interrupted, or an error while collecting (for example the submission does not import) |
| 3 | internal error |
| 4 | usage error (bad command line) |
| 5 | no tests were collected |

We write a tiny instructor test and four submissions, and run pytest on each in a child process.
""")

code("""
import os, subprocess, sys, tempfile, textwrap

TEST = textwrap.dedent('''
    from solution import add

    def test_small():
        assert add(2, 3) == 5

    def test_negative():
        assert add(-1, 1) == 0
''')

SUBMISSIONS = {
    "honest": "def add(a, b):\\n    return a + b\\n",
    "buggy": "def add(a, b):\\n    return a * b\\n",
    "broken": "def add(a, b)\\n    return a + b\\n",                # a syntax error
    "faker": "import os\\nos._exit(0)\\n",                           # leaves with status 0 while being imported
}

def run_pytest(solution_source, extra=()):
    \"\"\"Run the instructor test against `solution_source` in a fresh folder; return (exit code, folder).\"\"\"
    folder = tempfile.mkdtemp(prefix="lesson11-")
    with open(os.path.join(folder, "solution.py"), "w") as f:
        f.write(solution_source)
    with open(os.path.join(folder, "test_solution.py"), "w") as f:
        f.write(TEST)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, folder],
                            capture_output=True, text=True, cwd=folder, timeout=60)
    return result.returncode, folder

for name, source in SUBMISSIONS.items():
    code, _ = run_pytest(source)
    print(f"{name:>7}: pytest exit {code}")
""")

md("""
Look at the last line: the **faker** got exit code 0, the same as the honest submission, while not a single test
ran. `os._exit(0)` ends the process at once, without any clean-up, while pytest is still importing the tests.
Anyone who grades by `returncode == 0` gives the faker full marks.

## 2. Evidence instead of exit codes

We ask pytest for a report of every test (`--junitxml=FILE`, a standard XML format) in a place the grader chose,
and read it back. A real pass needs the exit code **and** a report in which every expected test passed.
""")

code("""
import xml.etree.ElementTree as ET

def read_report(path):
    \"\"\"{test name: "passed" | "failed" | "error" | "skipped"} from a JUnit XML file, or None when there is none.\"\"\"
    if not os.path.exists(path):
        return None
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag if child.tag != "failure" else "failed"
        results[case.get("name")] = outcome
    return results

for name, source in SUBMISSIONS.items():
    report = os.path.join(tempfile.mkdtemp(prefix="lesson11-report-"), "report.xml")
    code, _ = run_pytest(source, extra=[f"--junitxml={report}"])
    print(f"{name:>7}: exit {code}, evidence {read_report(report)}")
""")

md("""
The faker left no report at all: no evidence, so its verdict is **unverified**, whatever its exit code. (A clever
submission could *write* a fake report file. cellbox's grader therefore has its own pytest plugin send each result
over a private channel, tagged with a random number chosen for this run, that the submission cannot know.)

So, four verdicts, and only one of them is success:

* `verified`: exit 0 **and** evidence that every expected test ran and passed, in this run;
* `failed`: exit 1 with evidence that tests ran and some failed;
* `unverified`: anything else (exit 2 to 5, no evidence, evidence that does not add up);
* `timed_out`: the wall deadline passed. That is its own state, neither a pass nor a failure of the code's logic.

## 3. The green UNVERIFIED badge

A status page shows the label `TESTS VERIFIED`, `TESTS FAILED`, `TESTS UNVERIFIED` or `TESTS TIMED OUT`. Someone
colours it with a substring test:
""")

code("""
def naive_colour(label):
    return "green" if "VERIFIED" in label else "red"

for label in ("TESTS VERIFIED", "TESTS FAILED", "TESTS UNVERIFIED", "TESTS TIMED OUT"):
    print(f"{label:17} -> {naive_colour(label)}")
""")

md("""
`"VERIFIED" in "TESTS UNVERIFIED"` is true: the one state that means "we could not tell" is painted as success.
Compare labels (better: verdict values) **by equality**, with a table, and let everything unknown fall to a
neutral colour:
""")

code("""
COLOURS = {"TESTS VERIFIED": "green", "TESTS FAILED": "red", "TESTS TIMED OUT": "orange"}

def colour(label):
    return COLOURS.get(label, "grey")

for label in ("TESTS VERIFIED", "TESTS FAILED", "TESTS UNVERIFIED", "TESTS TIMED OUT", "tests verified!"):
    print(f"{label:17} -> {colour(label)}")
""")

md("""
## 4. Exercises

**`verdict(exit_code, expected, results, timed_out=False)`**: `expected` is the set of test names the instructor
wrote; `results` is the evidence, a dict `{name: outcome}` as `read_report` returns it, or `None` when there is none.
Return `"timed_out"` when `timed_out`; `"verified"` when the exit code is 0, the evidence names exactly the expected
tests and every one `"passed"`; `"failed"` when the exit code is 1, every expected test has a result and at least
one is `"failed"`; otherwise `"unverified"`.
""")

exercise("verdict", """
def verdict(exit_code, expected, results, timed_out=False):
    \"\"\"Return "verified", "failed", "unverified" or "timed_out" for one pytest run.\"\"\"
    ### BEGIN SOLUTION
    if timed_out:
        return "timed_out"
    if results is None or set(results) != set(expected) or not expected:
        return "unverified"
    outcomes = set(results.values())
    if exit_code == 0 and outcomes == {"passed"}:
        return "verified"
    if exit_code == 1 and "failed" in outcomes:
        return "failed"
    return "unverified"
    ### END SOLUTION
""")

check("verdict", """
def test():
    both = {"test_small", "test_negative"}
    passed = {"test_small": "passed", "test_negative": "passed"}
    expect(verdict(0, both, passed) == "verified", "exit 0 with every expected test passed should be 'verified'")
    got = verdict(0, both, None)
    expect(got == "unverified", f"exit 0 with no evidence gave {got!r}: that is the os._exit(0) faker, 'unverified'")
    got = verdict(0, both, {"test_small": "passed"})
    expect(got == "unverified", f"exit 0 with only one of two tests reported gave {got!r}: the evidence must be complete")
    got = verdict(1, both, {"test_small": "passed", "test_negative": "failed"})
    expect(got == "failed", f"exit 1 with a failed test gave {got!r}, expected 'failed'")
    got = verdict(2, both, {})
    expect(got == "unverified", f"exit 2 (a collection error) gave {got!r}: the tests never ran, 'unverified'")
    got = verdict(5, both, {})
    expect(got == "unverified", f"exit 5 (nothing collected) gave {got!r}, expected 'unverified'")
    got = verdict(0, both, passed, timed_out=True)
    expect(got == "timed_out", f"a run past its deadline gave {got!r}, expected 'timed_out'")
    return "only positive evidence is a pass"
check("verdict", test)
""")

md("""
**`badge_colour(label)`**: return `"green"` for `"TESTS VERIFIED"`, `"red"` for `"TESTS FAILED"`, `"orange"` for
`"TESTS TIMED OUT"` and `"grey"` for anything else. Compare by equality.
""")

exercise("badge_colour", """
def badge_colour(label):
    \"\"\"The colour of a status label, chosen by exact value: green only for "TESTS VERIFIED".\"\"\"
    ### BEGIN SOLUTION
    return {"TESTS VERIFIED": "green", "TESTS FAILED": "red", "TESTS TIMED OUT": "orange"}.get(label, "grey")
    ### END SOLUTION
""")

check("badge_colour", """
def test():
    got = badge_colour("TESTS UNVERIFIED")
    expect(got != "green", "TESTS UNVERIFIED came out green: compare labels with ==, not with `in`")
    expect(got == "grey", f"TESTS UNVERIFIED should be grey, got {got!r}")
    for label, wanted in [("TESTS VERIFIED", "green"), ("TESTS FAILED", "red"), ("TESTS TIMED OUT", "orange"),
                          ("NOT TESTS VERIFIED", "grey"), ("", "grey")]:
        got = badge_colour(label)
        expect(got == wanted, f"badge_colour({label!r}) gave {got!r}, expected {wanted!r}")
    return "green means verified, and nothing else"
check("badge_colour", test)
""")

md("""
## Common mistakes

* **`if returncode == 0: passed`.** Exit 0 is necessary, not sufficient: `os._exit(0)` fakes it.
* **Treating exit 2 or 5 as "failed".** The tests never ran; the student's code may be fine and the problem is
  elsewhere (a wrong file name, a missing module). Say `unverified`, and show why.
* **Trusting a report file the submission can write.** Evidence must come through a channel the submission cannot
  forge.
* **Substring or prefix tests on labels** (`"VERIFIED" in label`, `label.endswith("VERIFIED")`).

## Try this next

* Write a submission whose import kills its own parent process (`os.kill(os.getppid(), 9)`): what does pytest
  report, and what does `verdict` say?
* Add a `conftest.py` to a submission that marks every test as passed. Why must the grader keep the instructor's
  tests, and their configuration, out of the submission's reach?

## The real thing

`cellbox.verdict` defines the four verdicts and their labels (compared by equality, styled by exact value), and
`cellbox.grading` runs pytest with its own reporter plugin that sends per-test evidence tied to a per-run nonce.
""")
