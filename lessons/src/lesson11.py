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
    X -- "no: some failed, error or skipped" --> F[failed]
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
The faker left no report at all: no evidence, so its verdict is **unverified**, whatever its exit code.

A report *file* is weak evidence, though: a submission can write one itself. cellbox's grader therefore has its
own pytest plugin send each result over a channel (a file descriptor the grader opened), tagged with a random
nonce chosen for this run, and checks the whole record: the tests the instructor wrote were collected, each one
ran and reported, the session ended with pytest's own exit status. That stops an early `os._exit(0)`, a killed
pytest, a forged report file and messages from other processes. In this lesson's `run_pytest` the submission
runs inside pytest's own process, where code that deliberately goes looking could find a channel and its nonce;
so `cellbox grade` runs pytest, the tests and the plugin in a trusted process that never runs submission code,
and the submission in its own sandboxed process, which the tests reach through stand-ins and which answers only
with plain data. That boundary is as strong as the isolation: with `--isolation none` the submission runs as the
grader's user and can reach the trusted process (the documentation's Grading page, "What this does not
stop").

The name "three-state" counts what the evidence can say about the code: it passed, it failed, or we cannot tell.
A run that ran out of time is a fourth verdict of its own. So, four verdicts, and only one of them is success:

* `verified`: exit 0 **and** evidence that every expected test ran and passed, in this run;
* `failed`: the tests ran (complete evidence) and not all passed: exit 1 with tests `failed` or in `error`, or
  exit 0 with tests `skipped` (a skip is not a pass);
* `unverified`: anything else: exit 2 to 5, no evidence or incomplete evidence, or evidence that contradicts the
  exit code (exit 1 with every test passed, exit 0 with a failure);
* `timed_out`: the wall deadline passed. That is its own state, neither a pass nor a failure of the code's logic.

These are the rules of `cellbox grade` (the documentation's Verdicts page), in small.

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
Apply the rules above, in this order: `"timed_out"` when `timed_out`; `"unverified"` when the exit code is not 0
or 1, or the evidence does not name exactly the expected tests; `"verified"` when every outcome is `"passed"` and
the exit code is 0; `"unverified"` when every outcome is `"passed"` but the exit code is 1, or when the exit code
is 0 but some outcome is `"failed"` or `"error"`; otherwise `"failed"`.
""")

exercise("verdict", """
def verdict(exit_code, expected, results, timed_out=False):
    \"\"\"Return "verified", "failed", "unverified" or "timed_out" for one pytest run.\"\"\"
    ### BEGIN SOLUTION
    if timed_out:
        return "timed_out"
    if exit_code not in (0, 1) or results is None or not expected or set(results) != set(expected):
        return "unverified"
    outcomes = set(results.values())
    if outcomes == {"passed"}:
        return "verified" if exit_code == 0 else "unverified"
    if exit_code == 0 and outcomes & {"failed", "error"}:
        return "unverified"
    return "failed"
    ### END SOLUTION
""")

check("verdict", """
def test():
    both = {"test_small", "test_negative"}
    passed = {"test_small": "passed", "test_negative": "passed"}
    failed = {"test_small": "passed", "test_negative": "failed"}
    error = {"test_small": "passed", "test_negative": "error"}
    expect(verdict(0, both, passed) == "verified", "exit 0 with every expected test passed should be 'verified'")
    got = verdict(0, both, None)
    expect(got == "unverified", f"exit 0 with no evidence gave {got!r}: that is the os._exit(0) faker, 'unverified'")
    got = verdict(0, both, {"test_small": "passed"})
    expect(got == "unverified", f"exit 0 with only one of two tests reported gave {got!r}: the evidence must be complete")
    got = verdict(0, both, {**passed, "test_extra": "passed"})
    expect(got == "unverified", f"exit 0 with evidence of a test the instructor never wrote gave {got!r}: the "
           "evidence must name exactly the expected tests, set(results) == expected, not a subset test (<=)")
    got = verdict(0, both, {"test_small": "passed", "test_other": "passed"})
    expect(got == "unverified", f"exit 0 with evidence of two tests, one of them not an expected one, gave {got!r}: "
           "compare the names, not how many there are")
    got = verdict(1, both, failed)
    expect(got == "failed", f"exit 1 with a failed test gave {got!r}, expected 'failed'")
    got = verdict(1, both, error)
    expect(got == "failed", f"exit 1 with a test in error gave {got!r}: the tests ran and one did not pass, 'failed'")
    got = verdict(0, both, {"test_small": "passed", "test_negative": "skipped"})
    expect(got == "failed", f"exit 0 with a skipped test gave {got!r}: a skip is not a pass, 'failed'")
    got = verdict(1, both, passed)
    expect(got == "unverified", f"exit 1 with every test passed gave {got!r}: evidence and exit code disagree, 'unverified'")
    got = verdict(0, both, failed)
    expect(got == "unverified", f"exit 0 with a failed test gave {got!r}: evidence and exit code disagree, 'unverified'")
    got = verdict(0, both, error)
    expect(got == "unverified", f"exit 0 with a test in error gave {got!r}: an 'error' contradicts exit 0 as much "
           "as a 'failed' does; look for both, 'unverified'")
    got = verdict(1, both, {"test_small": "failed"})
    expect(got == "unverified", f"exit 1 with evidence of only one of two tests gave {got!r}: incomplete evidence "
           "is 'unverified' before anything is 'failed' (rule order)")
    meaning = {2: "interrupted or a collection error", 3: "an internal error", 4: "a usage error",
               5: "nothing collected", -9: "killed by a signal", 6: "a status pytest never gives",
               137: "killed by SIGKILL, as a shell reports it"}
    for code, what in meaning.items():
        for evidence in ({}, passed, failed):
            got = verdict(code, both, evidence)
            expect(got == "unverified", f"exit {code} ({what}) gave {got!r}: the tests never ran to the end, so every "
                   "exit code other than 0 and 1 is 'unverified', whatever the evidence says")
    got = verdict(2, both, None, timed_out=True)
    expect(got == "timed_out", f"a run past its deadline with exit 2 and no evidence gave {got!r}: the time-out "
           "rule comes first, 'timed_out'")
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
    expect(badge_colour("TESTS UNVERIFIED") != "green", "TESTS UNVERIFIED came out green: testing with `in` "
           "(\\"VERIFIED\\" in label); compare the whole label with ==")
    for label, wanted in [("TESTS VERIFIED", "green"), ("TESTS FAILED", "red"), ("TESTS TIMED OUT", "orange"),
                          ("TESTS UNVERIFIED", "grey")]:
        got = badge_colour(label)
        expect(got == wanted, f"badge_colour({label!r}) gave {got!r}, expected {wanted!r}")
    tricks = [  # (label, what a function that colours it is doing)
        ("NOT VERIFIED", "testing with `in` (\\"VERIFIED\\" in label)"),
        ("NOT TESTS VERIFIED", "testing how the label ends (endswith, or its last word)"),
        ("TESTS VERIFIED (stale)", "testing how the label starts (startswith, or its first words)"),
        ("tests verified", "changing the case (.upper(), .lower()) before comparing"),
        ("Tests Verified", "changing the case (.upper(), .lower()) before comparing"),
        ("TESTS  VERIFIED", "splitting the label into words before comparing"),
        (" TESTS VERIFIED\\n", "stripping spaces (.strip()) before comparing"),
        ("TESTS FAILED (2)", "testing how the label starts (startswith, or its first words)"),
        ("NOT TESTS FAILED", "testing how the label ends (endswith, or its last word)"),
        ("tests timed out", "changing the case (.upper(), .lower()) before comparing"),
        ("", None), ("VERIFIED", None), ("TESTS", None),
    ]
    for label, mistake in tricks:
        got = badge_colour(label)
        if got != "grey":
            raise Feedback(f"badge_colour({label!r}) gave {got!r}, expected 'grey': "
                           f"{(mistake + ': ') if mistake else ''}compare the whole label with == (a dict lookup), "
                           "anything else is grey")
    return "green means verified, and nothing else"
check("badge_colour", test)
""")

md("""
**`what_counts()`**: two questions about evidence. For each one, return the letter of the answer that holds.
""")

exercise("what_counts", """
QUESTIONS = {
    "source": ("Where does the grader take its evidence of which tests passed from?", {
        "a": "report.xml in the submission's folder, as pytest --junitxml wrote it",
        "b": "its own reporter plugin, which sends each result over a channel the grader opened, with this run's nonce",
        "c": "pytest's exit code"}),
    "forged": ("Run as in this lesson (inside pytest's process), a submission writes report.xml saying every test "
               "passed, then calls os._exit(0) while pytest imports it. The grader reads a channel with a nonce. "
               "What is the verdict?", {
        "a": "verified: the report says every test passed",
        "b": "unverified: the grader's own reporter sent no record of the tests",
        "c": "failed: the submission cheated"}),
}

def what_counts():
    \"\"\"{question: the letter of the answer that holds}, one entry per key of QUESTIONS.\"\"\"
    ### BEGIN SOLUTION
    # A file the submission can write proves nothing; only the grader's own channel counts, and no record is no proof.
    return {"source": "b", "forged": "b"}
    ### END SOLUTION
""")

check("what_counts", f"""
ANSWERS = {hashed("what_counts", {"source": "b", "forged": "b"})}
WHY = {sealed("what_counts", {
    ("source", "a"): "trusting a report file the submission can write: it can write one saying anything",
    ("source", "c"): "exit 0 is necessary, not sufficient: os._exit(0) fakes it",
    ("forged", "a"): "trusting a report file the submission can write: only the grader's channel counts",
    ("forged", "c"): "what proves that the tests ran at all, or that they failed?",
})}

def test():
    guesses = what_counts()
    expect(isinstance(guesses, dict) and set(guesses) == set(QUESTIONS),
           f"what_counts() should return a dict with the keys {{sorted(QUESTIONS)}}")
    for key in ANSWERS:
        got = guesses[key]
        expect(got in QUESTIONS[key][1], f"{{key}}: {{got!r}} is not one of the letters {{sorted(QUESTIONS[key][1])}}")
    for key in wrong_keys("what_counts", guesses, ANSWERS):
        got = guesses[key]
        raise Feedback(f"{{key}}: {{got}} ({{QUESTIONS[key][1][got]}}) does not hold: {{unseal('what_counts', key, got, WHY, 'read the question again')}}")
    return "evidence comes from the grader's own channel, or there is none"
check("what_counts", test)
""")

md("""
## Common mistakes

* **`if returncode == 0: passed`.** Exit 0 is necessary, not sufficient: `os._exit(0)` fakes it.
* **Treating exit 2 or 5 as "failed".** The tests never ran; the student's code may be fine and the problem is
  elsewhere (a wrong file name, a missing module). Say `unverified`, and show why.
* **Counting a skip as a pass, or an error as "could not tell".** A skipped test did not pass (`failed`); a test
  in error ran and did not pass (`failed`).
* **Trusting a report file the submission can write.** Evidence must come through a channel the grader owns and
  checks for consistency (the third exercise).
* **Substring or prefix tests on labels** (`"VERIFIED" in label`, `label.endswith("VERIFIED")`,
  `label.startswith("TESTS VERIFIED")`), or tidying a label before looking it up (`.strip().upper()`): each paints
  some other label green. Compare the whole label with `==`.
* **A subset or a count instead of the names.** `expected <= set(results)` and `len(results) == len(expected)`
  both accept evidence of tests the instructor never wrote; compare `set(results) == expected`.
* **Checking only for `"failed"`.** A test in `"error"` did not pass either.

## Try this next

* Write a submission whose import kills its own process with SIGKILL (`import os; os.kill(os.getpid(), 9)`) and
  run it with `run_pytest(..., extra=[f"--junitxml={report}"])`: what exit code do you get, is there a report, and
  what does `verdict` say?
* Add a `conftest.py` to a submission that marks every test as passed. Why must the grader keep the instructor's
  tests, and their configuration, out of the submission's reach?

## Key points

* pytest's exit codes: 0 all passed, 1 some failed, 2 interrupted or a collection error, 3 internal error, 4 usage
  error, 5 nothing collected. Exit 0 is necessary, not sufficient: `os._exit(0)` fakes it.
* `verified` needs positive evidence, from a reporter the grader owns, that every expected test ran and passed;
  tests that ran and did not all pass are `failed`; anything that proves nothing is `unverified`; the deadline is
  `timed_out`.
* The channel and nonce stop early exits, killed runs and forged files; keeping submission code out of pytest's
  process (its own sandboxed process, plain data back) stops a deliberate forgery, as far as the isolation holds.
* Compare labels and verdicts by equality: `"VERIFIED" in "TESTS UNVERIFIED"` is true.

## The real thing

`cellbox.verdict` defines the four verdicts and their labels (compared by equality, styled by exact value), and
`cellbox.grading` runs pytest with its own reporter plugin that sends per-test evidence tied to a per-run nonce.
""")

answers("""
## Answers to "Try this next"

* pytest dies while importing the test module: `run_pytest` sees exit code `-9` (killed by SIGKILL), there is no
  report, and `verdict(-9, {"test_small", "test_negative"}, None)` is `"unverified"`: nothing proves the tests ran.
* A `conftest.py` next to the tests is loaded by pytest before the tests and can rewrite every report
  (`pytest_runtest_makereport`) as passed. If the submission could place one where pytest reads it (or change
  `pytest.ini`), it would decide its own verdict; so `cellbox grade` runs the instructor's copy of the tests from a
  folder outside the submission, with `-c pytest.ini --confcutdir`, and never reads the submission's configuration.
""")
