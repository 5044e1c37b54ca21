lesson(13, "the-cellbox-kernel", "The cellbox kernel")

md("""
# Lesson 13: the cellbox kernel

**Goal:** see how the cellbox kernel puts lessons 1 to 12 together, and use it for real: per-cell limits with
`%%limits`, an `Outcome` read from `cellbox.sandbox.run`, and a folder of submissions graded with `cellbox grade`.

**The plan.** We follow one cell from JupyterLab to a limited child process and back, and check from inside this
notebook what the kernel did to our cell (a new process, lowest priority, limits, a scrubbed environment). Then we
break a few limits on purpose with `%%limits`, run children through the sandbox core ourselves and read their
`Outcome`, and finally grade three small submissions and look at the report.

This lesson is written for the **`Python 3 (cellbox)`** kernel (check the top right corner of JupyterLab).
""")

md("""
## 1. A cell's journey

```mermaid
sequenceDiagram
    participant L as JupyterLab
    participant K as cellbox kernel (long-lived, has threads)
    participant S as launcher + supervisor (_launch.py)
    participant C as your cell (a fresh child)
    L->>K: execute_request (the cell's code)
    K->>K: read %%limits, build the allowlisted environment (lesson 4)
    K->>S: start python -I _launch.py SPEC in a new session (lesson 7)
    S->>C: fork, setrlimit + nice + ionice, exec (lessons 5, 8, 9)
    C->>C: start from what the earlier cells left, run the cell
    C-->>K: stdout/stderr as they come; plots and results as JSON on fd 3 (lesson 12)
    K->>K: wall deadline (lesson 6); on the end: kill the group and every stray (lesson 7)
    S-->>K: exit status and rusage, as JSON
    K-->>L: streams, display_data, error (e.g. CellTimeoutError), reply with the Outcome
```

The kernel process itself never runs your code, never unpickles what a cell produced, and keeps answering
(interrupts, completions) while a cell runs. Your variables travel from cell to cell **inside the children**:
the kernel process never holds them.

## 2. Look at your own cell

Run these two cells and compare: each cell is a new process with its own pid, at niceness 19, with limits, with a
home directory inside a throwaway task directory and none of the kernel's variables.
""")

code("""
import os, resource, sys

MB = 1024 * 1024
first_pid = os.getpid()
print("pid:", first_pid, "| niceness:", os.nice(0))
print("RLIMIT_AS:", resource.getrlimit(resource.RLIMIT_AS)[0] // MB, "MB | RLIMIT_CPU:", resource.getrlimit(resource.RLIMIT_CPU))
print("HOME:", os.environ.get("HOME"))
print("environment names:", sorted(os.environ))
""")

code("""
print("this cell's pid:", os.getpid(), "| the previous cell's:", first_pid, "| same process?", os.getpid() == first_pid)
""")

md("""
Under the cellbox kernel the two pids differ, yet `first_pid` (and `os`, `MB`...) came through: names you define
are there in later cells. What is not a name lives and dies with its cell: processes and threads a cell started end
with it.

A server started in a cell does not survive the cell: the supervisor kills every process the cell left behind.
""")

code("""
import subprocess, time

server = subprocess.Popen([sys.executable, "-m", "http.server", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
server_pid = server.pid
time.sleep(0.3)
print("started a server with pid", server_pid)
del server
""")

code("""
def alive(pid):
    \"\"\"True if process `pid` exists and is not a zombie.\"\"\"
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

print("the server from the previous cell is alive:", alive(server_pid))
if alive(server_pid):          # only under a kernel that keeps processes between cells
    os.kill(server_pid, 9)
""")

md("""
## 3. `%%limits`: per-cell limits

A first line `%%limits wall=... cpu=... memory=... output=...` changes the limits for that one cell (sizes like
`256M`, times like `2.5s`); on any other line the kernel runs none of the cell and says `%%limits` works on the
first line only. When a limit stops a cell you get an error with a name and a sentence, and the kernel lives on.
Before raising a limit, ask why it was reached: a `cpu_limit` most often means a loop that never ends. The next three cells **fail on purpose** (they are tagged `raises-exception`, so "Run All" goes on).
""")

code("""
%%limits wall=2
import time
print("going to sleep for 5 s...")
time.sleep(5)
print("never printed")
""", tags=["raises-exception"])

code("""
%%limits cpu=1 wall=30
while True:
    pass
""", tags=["raises-exception"])

code("""
%%limits memory=300M
hoard = []
for _ in range(10):
    hoard.append(bytearray(100 * 1024 * 1024))
""", tags=["raises-exception"])

md("""
Three different names for three different problems: `CellTimeoutError` (the wall clock), `CellCPULimitError`
(RLIMIT_CPU) and `CellMemoryLimitError` (RLIMIT_AS: the allocation failed long before the machine had to swap).
A bad `%%limits` line is an error too, and the cell does not run at all:
""")

code("""
%%limits memory=lots
print("this line never runs")
""", tags=["raises-exception"])

md("""
The message names the limit and shows what a good value looks like.

## 4. Reading an `Outcome`

The kernel and the grader start every child through one function, `cellbox.sandbox.run`, and you can call it
yourself. It returns an `Outcome`: `status` (one of `ok`, `error`, `crashed`, `timed_out`, `cpu_limit`,
`memory_limit`, `output_limit`, `interrupted`), `exit_code`, `signal`, `wall_time`, `cpu_time`, `peak_memory`,
`stdout`, `stderr`, `isolation`, `notes`, `killed_processes`...
""")

code("""
from cellbox.sandbox.limits import Limits
from cellbox.sandbox import run

limits = Limits(wall_time=2, cpu_time=1, memory=256 * MB)
spin_limits = limits.replace(wall_time=30)   # room on the wall clock, so a busy machine still says cpu_limit
programs = {
    "hello": ("print('hello')", limits),
    "bug": ("1 / 0", limits),
    "spin": ("while True: pass", spin_limits),
    "sleep": ("import time; time.sleep(60)", limits),
    "hog": ("x = bytearray(512 * 1024 * 1024)", limits),
    "daemon": ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)'])", limits),
}
print("running as uid", os.getuid(), "| cell's working directory:", os.getcwd())
outcomes = {}
for name, (source, run_limits) in programs.items():
    outcome = run([sys.executable, "-c", source], limits=run_limits)
    outcomes[name] = outcome.to_json()
    print(f"{name:>6}: {outcome.summary()}")
    if outcome.exit_code in (126, 127):   # the launcher could not start the program at all
        said = outcome.stderr.strip().splitlines()
        print("        the program never started:", said[-1] if said else "the launcher gave no reason")
print("isolation layers:", outcomes["hello"]["isolation"])
""")

md("""
Each `status` is an exact string: compare it with `==`. (If the summary says "ran as root: not contained", this
machine runs notebooks as root: rlimits cannot hold root back, which is why cellbox can run children as another
user.) Note the daemon: its program ended with `ok`, and the supervisor still found and killed the process it left
behind: the summary ends with `killed=1`, the number of processes the supervisor killed after the program ended
(it appears only when there were some).

If a line says `status=error exit=126` or `exit=127` instead, the launcher could not start the program at all
(126 is the shell's "found but could not run" status, 127 "not found"), and the cell prints the launcher's
reason below it. The exercises below do not depend on this cell: their checks build their own `Outcome` dicts.

## 5. Grading a folder with `cellbox grade`

`cellbox grade SUBMISSIONS --tests TESTS --out DIR` grades each entry of a folder (a package folder, a `.zip`, a
single `.py`, or a notebook) in its own throwaway virtualenv, inside the sandbox, against hidden pytest tests, and
writes `results.json`, `grades.csv`, `junit.xml` and `report.html`. Three submissions of lesson 1's exercise: an
honest one, a buggy one, and one that fakes success with `os._exit(0)`. Grading takes a few seconds, more on a
busy machine, so the cell's first line gives it two minutes instead of the session's default.
""")

code("""
%%limits wall=120
import csv, shutil, tempfile, textwrap

work = tempfile.mkdtemp(prefix="lesson13-")
submissions, tests, out = (os.path.join(work, name) for name in ("submissions", "tests", "out"))
os.makedirs(submissions)
os.makedirs(tests)
honest = textwrap.dedent('''
    import subprocess, sys
    def run_isolated(code):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return r.returncode == 0, r.stdout, r.stderr
''')
sources = {"honest": honest, "buggy": honest.replace("== 0", "!= 0"), "faker": "import os\\nos._exit(0)\\n"}
for name, source in sources.items():
    with open(os.path.join(submissions, f"{name}.py"), "w") as file:
        file.write(source)
with open(os.path.join(tests, "test_run_isolated.py"), "w") as file:
    file.write(textwrap.dedent('''
        from submission import run_isolated

        def test_success():
            assert run_isolated("print(1)") == (True, "1\\\\n", "")

        def test_failure():
            assert run_isolated("1/0")[0] is False
    '''))
del file

started = time.monotonic()
graded = subprocess.run([sys.executable, "-m", "cellbox.cli", "grade", submissions, "--tests", tests, "--out", out,
                         "--jobs", "2", "--wall", "20", "--memory", "1G"], capture_output=True, text=True)
print(f"cellbox grade exited {graded.returncode} after {time.monotonic() - started:.1f} s")
instructor_tests = open(os.path.join(tests, "test_run_isolated.py")).read().count("\\ndef test_")
if os.path.exists(os.path.join(out, "grades.csv")):
    for row in csv.DictReader(open(os.path.join(out, "grades.csv"))):
        print(f"{row['id']:>7}: {row['verdict']:<11} passed {row['passed']} of the {instructor_tests} instructor tests")
else:
    print("no grades were written:", (graded.stderr or graded.stdout).strip()[-500:])
""")

md("""
The faker's exit status was 0, and its verdict is still not `verified`: the grader's own pytest plugin sent no
evidence that the tests ran (lesson 11). Its process ended while the tests imported it, before any of the two
tests could run, so none passed; the other columns of its row in `grades.csv` (`failed`, `errors`, `total`) count
what the grader could record of that run, not two results of tests that ran: the documentation's Grading page
says what each column counts. The same HTML report instructors get is shown below (in a sandboxed
frame, so its styles stay inside it).
""")

code("""
import html
from IPython.display import display

report = os.path.join(out, "report.html")
if os.path.exists(report):
    page = open(report).read()
    frame = f'<iframe sandbox srcdoc="{html.escape(page)}" style="width: 100%; height: 420px; border: 1px solid #ccc"></iframe>'
    display({"text/html": frame, "text/plain": f"report.html ({len(page)} characters)"}, raw=True)
else:
    print("no report.html was written")
""")

code("""
shutil.rmtree(work)
print("removed the grading folder")
""")

md("""
Instructors: the hidden tests for these lessons are in `lessons/grading/` (one file per lesson). Collect the
completed notebooks of the lessons you handed out (one notebook per student for one lesson, or one folder per
student) and grade them against **those lessons' tests only**, for example
`cellbox grade lesson7/ --tests lessons/grading/test_lesson07.py --out results`. Grading against the whole folder
expects every lesson: a student who did 6 of the 13 gets `failed`, since every test of a lesson not handed in fails.

## 6. Exercises

Both take an `Outcome` as the JSON dict `Outcome.to_json()` gives (like the values of `outcomes` above); its
`"limits"` holds the run's limits, times in seconds and sizes in bytes, as floats or integers.

**`limit_hit(outcome)`**: the name of the `Limits` field that stopped the run: `"wall_time"` for `timed_out`,
`"cpu_time"` for `cpu_limit`, `"memory"` for `memory_limit`, `"output"` for `output_limit`, else `None`.
""")

exercise("limit_hit", """
def limit_hit(outcome):
    \"\"\"The Limits field ("wall_time", "cpu_time", "memory", "output") that stopped a run, or None.\"\"\"
    ### BEGIN SOLUTION
    return {"timed_out": "wall_time", "cpu_limit": "cpu_time", "memory_limit": "memory",
            "output_limit": "output"}.get(outcome["status"])
    ### END SOLUTION
""")

check("limit_hit", """
def outcome(status, **limits):
    \"\"\"An Outcome as to_json() gives it (only the fields the exercises read).\"\"\"
    base = {"wall_time": 30.0, "cpu_time": 30.0, "memory": 2 * 1024**3, "output": 1024**2}
    return {"status": status, "exit_code": None, "signal": None, "limits": {**base, **limits}}

def test():
    given = {}
    for status, wanted in [("ok", None), ("error", None), ("crashed", None), ("interrupted", None),
                           ("cpu_limit", "cpu_time"), ("timed_out", "wall_time"), ("memory_limit", "memory"),
                           ("output_limit", "output")]:
        try:
            got = limit_hit(outcome(status))
        except KeyError as error:
            raise Feedback(f"for a run with status {status!r} limit_hit raised KeyError {error}: a run that hit no limit "
                           "gives None, so look the status up with .get()") from None
        if got != wanted and got in given.values() and got is not None:
            same = next(other for other, answer in given.items() if answer == got)
            raise Feedback(f"limit_hit gave {got!r} for both {same!r} and {status!r}: comparing statuses with `in` "
                           "(\\"limit\\" in status is true for three statuses); compare with ==")
        expect(got == wanted, f"for a run with status {status!r} limit_hit gave {got!r}, expected {wanted!r}")
        given[status] = got
    return "you can tell which limit stopped a run"
check("limit_hit", test)
""")

md("""
**`limits_line(outcome)`**: the `%%limits` line that would give a stopped run twice the limit it hit, read from
`outcome["limits"]`: `"%%limits wall=4"` for a run that timed out under `wall_time` 2, `"%%limits cpu=2"`,
`"%%limits memory=512M"` (sizes in whole MB) or `"%%limits output=2048K"` (in whole KB); `None` when no limit was hit.
Times may be floats: write `4`, not `4.0`, `5` for twice 2.5 and `0.4` for twice 0.2.
""")

exercise("limits_line", """
def limits_line(outcome):
    \"\"\"A %%limits line doubling the limit that stopped the run, or None.\"\"\"
    ### BEGIN SOLUTION
    limits, status = outcome["limits"], outcome["status"]
    if status == "timed_out":
        return f"%%limits wall={limits['wall_time'] * 2:g}"
    if status == "cpu_limit":
        return f"%%limits cpu={limits['cpu_time'] * 2:g}"
    if status == "memory_limit":
        return f"%%limits memory={limits['memory'] * 2 // (1024 * 1024)}M"
    if status == "output_limit":
        return f"%%limits output={limits['output'] * 2 // 1024}K"
    return None
    ### END SOLUTION
""")

check("limits_line", """
def outcome(status, **limits):
    \"\"\"An Outcome as to_json() gives it (only the fields the exercises read).\"\"\"
    base = {"wall_time": 30.0, "cpu_time": 30.0, "memory": 2 * 1024**3, "output": 1024**2}
    return {"status": status, "exit_code": None, "signal": None, "limits": {**base, **limits}}

def test():
    for run, wanted in [(outcome("timed_out", wall_time=2.0), "%%limits wall=4"),
                        (outcome("timed_out", wall_time=2.5), "%%limits wall=5"),
                        (outcome("timed_out", wall_time=0.25), "%%limits wall=0.5"),
                        (outcome("timed_out", wall_time=1.75), "%%limits wall=3.5"),
                        (outcome("cpu_limit", cpu_time=1.0), "%%limits cpu=2"),
                        (outcome("cpu_limit", cpu_time=0.2), "%%limits cpu=0.4"),
                        (outcome("cpu_limit", cpu_time=3), "%%limits cpu=6"),
                        (outcome("memory_limit", memory=256 * 1024**2), "%%limits memory=512M"),
                        (outcome("memory_limit", memory=1536 * 1024**2), "%%limits memory=3072M"),
                        (outcome("output_limit", output=1024**2), "%%limits output=2048K"),
                        (outcome("output_limit", output=1536), "%%limits output=3K"),
                        (outcome("ok"), None), (outcome("crashed"), None), (outcome("error"), None),
                        (outcome("interrupted"), None)]:
        got = limits_line(run)
        if got != wanted and isinstance(got, str) and isinstance(wanted, str):
            if got.replace(".0", "") == wanted:
                raise Feedback(f"limits_line gave {got!r}, expected {wanted!r}: limits are floats in an Outcome, "
                               "so format them with :g (4.0 becomes 4, 2.5 stays 2.5)")
            field = {"timed_out": "wall_time", "cpu_limit": "cpu_time"}.get(run["status"])
            if field and run["limits"][field] % 1 and got.split("=")[0] == wanted.split("=")[0]:
                raise Feedback(f"limits_line gave {got!r}, expected {wanted!r}: int() and "
                               "round() drop the fraction of a sub-second limit; format the doubled float with :g")
        expect(got == wanted, f"for a {run['status']!r} run with limits {run['limits']} limits_line gave {got!r}, expected {wanted!r}")
    return "a stopped student gets a concrete next step"
check("limits_line", test)
""")

md("""
**`what_next()`**: three situations in the cellbox kernel. For each one, return the letter of what happens, or of
what to do.
""")

exercise("what_next", """
QUESTIONS = {
    "second_line": ("A cell's first line is print('start') and its second line is %%limits wall=60. What happens?", {
        "a": "it prints start, then runs the rest with a 60 s wall limit",
        "b": "none of it runs: the kernel says %%limits works on the first line of a cell only",
        "c": "the whole cell runs with a 60 s wall limit"}),
    "thread": ("A cell starts a thread that sleeps 100 s, as t. What does t.is_alive() say in the next cell?", {
        "a": "True: it is still sleeping",
        "b": "False: the thread ended with the cell that started it",
        "c": "NameError: t is gone"}),
    "stopped": ("The cell i = 0 / while i < 10: total = i is stopped with cpu_limit. What do you do first?", {
        "a": "put %%limits cpu=60 on its first line",
        "b": "find why the loop never ends (i never grows)",
        "c": "restart the kernel"}),
}

def what_next():
    \"\"\"{question: the letter of what happens, or of what to do}, one entry per key of QUESTIONS.\"\"\"
    ### BEGIN SOLUTION
    # A cell magic is read on the first line only; names carry, threads and processes do not; fix the loop.
    return {"second_line": "b", "thread": "b", "stopped": "b"}
    ### END SOLUTION
""")

check("what_next", f"""
ANSWERS = {hashed("what_next", {"second_line": "b", "thread": "b", "stopped": "b"})}
WHY = {sealed("what_next", {
    ("second_line", "a"): "putting %%limits anywhere but the first line: it is a cell magic, read on the first line only",
    ("second_line", "c"): "putting %%limits anywhere but the first line: it is a cell magic, read on the first line only",
    ("thread", "a"): "keeping a thread for the next cell: what ends when a cell's process ends?",
    ("thread", "c"): "names carry to later cells (t is there); ask what happens to the thread itself",
    ("stopped", "a"): "raising limits instead of fixing the loop: does i ever grow?",
    ("stopped", "c"): "the kernel lives on after a stopped cell; look at the loop: does i ever grow?",
})}

def test():
    guesses = what_next()
    expect(isinstance(guesses, dict) and set(guesses) == set(QUESTIONS),
           f"what_next() should return a dict with the keys {{sorted(QUESTIONS)}}")
    for key in ANSWERS:
        got = guesses[key]
        expect(got in QUESTIONS[key][1], f"{{key}}: {{got!r}} is not one of the letters {{sorted(QUESTIONS[key][1])}}")
    for key in wrong_keys("what_next", guesses, ANSWERS):
        got = guesses[key]
        raise Feedback(f"{{key}}: {{got}} ({{QUESTIONS[key][1][got]}}) is not what happens: {{unseal('what_next', key, got, WHY, 'read the question again')}}")
    return "first line for %%limits, nothing but names between cells, and a loop to fix"
check("what_next", test)
""")

md("""
## Common mistakes

* **Putting `%%limits` anywhere but the first line.** It is a cell magic: first line only (the third exercise).
* **Keeping a server or a thread "for the next cell".** Processes and threads a cell started end with it; start
  what you need in the cell that needs it (the third exercise).
* **Comparing statuses with `in`.** `"limit" in status` is true for three different statuses; compare with `==` (the first exercise).
* **Printing a float limit as it is.** `f"{2.0 * 2}"` is `"4.0"`; `%%limits` wants `wall=4`: format with `:g` (the second exercise).
  `int()` or `round()` are no cure: twice a 0.2 s limit would become `cpu=0`.
* **Raising limits instead of fixing the loop.** A `cpu_limit` usually means the loop never ends (the third
  exercise).

## Try this next

* Print something every second for 5 seconds in a cell: the lines arrive while the cell runs.
* Run `%%limits output=1K` and print 10 000 lines.
* Grade your own completed notebook of lesson 1: put it alone in a folder and run
  `cellbox grade FOLDER --tests lessons/grading/test_lesson01.py --out results`, then open `results/report.html`.

## Key points

* The kernel composes lessons 1 to 12: every cell is a fresh, limited, low-priority child with a scrubbed
  environment, killed with everything it started; names you define are there in later cells.
* `%%limits` on a cell's first line changes that cell's limits; a limit that stops a cell gives a named error and
  a sentence, and the kernel lives on.
* `cellbox.sandbox.run` returns an `Outcome` whose `status` is an exact string; compare it with `==`.
* `cellbox grade` gives each submission a verdict from evidence; grade against the tests of the lessons handed out.

## The real thing

`cellbox.kernel` (the kernel), `cellbox.kernel.cellrunner` (the child side of a cell), `cellbox.sandbox` (`run`, `start`,
`Outcome`), `cellbox.sandbox.limits` (`Limits`, `%%limits` parsing), `cellbox.verdict` and `cellbox.grading`
(`cellbox grade`). You have now written a small version of each.
""")

answers("""
## Answers to "Try this next"

* The lines arrive one per second while the cell runs: the kernel streams the child's output as it comes.
* The cell stops with `CellOutputLimitError` once it has printed more than 1 KB; what it printed up to the limit is
  shown, and the kernel lives on.
* The completed notebook of lesson 1 gets `verified` (every test of `test_lesson01.py` passed); `report.html`
  shows one row for it and the pass rate of each test.
""")
