lesson(3, "timeouts", "Timeouts")

md("""
# Lesson 3: timeouts

**Goal:** stop a child that runs too long, and report "it ran out of time" as its own kind of result.

**The plan.** A child that never ends makes `subprocess.run` wait forever, so we first give it a deadline with
`timeout=`. We see what happens when the deadline passes (the child is killed and an exception is raised in *our*
program), then we turn that exception into a result with its own name, because "too slow" is not the same as
"crashed". Last, why a timeout alone does not make a sandbox.
""")

md("""
## 1. A child that never finishes

The child below would loop forever. We never run it without a deadline, because our notebook would hang with it.
With `timeout=1`, `subprocess.run` waits at most one second, then **kills the child** and raises
`subprocess.TimeoutExpired`.
""")

code("""
import subprocess, sys, time

forever = "while True: pass"
started = time.monotonic()
try:
    subprocess.run([sys.executable, "-c", forever], capture_output=True, text=True, timeout=1)
except subprocess.TimeoutExpired as expired:
    print(f"TimeoutExpired after {time.monotonic() - started:.1f} s: {expired}")
""")

md("""
The exception is raised in **our** program, not in the child. If we let it escape, a slow student submission
would crash the grader, which is exactly what a sandbox must prevent. So we catch it and say what happened in a
word the caller can compare: here `"timed_out"`, beside `"ok"` and `"error"`.

The exception also carries any output the child produced before the deadline (`expired.stdout`, as bytes or
`None`): useful for showing the student how far their program got.
""")

code("""
slow_but_chatty = "import time\\nfor i in range(100):\\n    print('step', i, flush=True)\\n    time.sleep(0.3)"
try:
    subprocess.run([sys.executable, "-c", slow_but_chatty], capture_output=True, text=True, timeout=1)
except subprocess.TimeoutExpired as expired:
    partial = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
    print("before the deadline the child printed:", partial.split())
""")

md("""
## 2. A timeout is not a security boundary

A timeout limits *how long*, not *what*. In one second a child can delete your files, read your secrets
(lesson 4), allocate all the memory of the machine (lesson 5), or start a process that outlives it (lesson 7).
Think of the timeout as one wall of the box; the next lessons add the others.

## 3. Exercise: `run_with_timeout`

Write `run_with_timeout(code, seconds)` that runs `code` in a new Python process and returns one of three
strings: `"ok"` (return code 0), `"error"` (any other return code) or `"timed_out"` (the deadline passed).
It must never raise `TimeoutExpired`.
""")

exercise("run_with_timeout", """
import subprocess, sys

def run_with_timeout(code, seconds):
    \"\"\"Run `code` in a new process for at most `seconds`; return "ok", "error" or "timed_out".\"\"\"
    ### BEGIN SOLUTION
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return "timed_out"
    return "ok" if result.returncode == 0 else "error"
    ### END SOLUTION
""")

check("run_with_timeout", """
import time

def test():
    expect(run_with_timeout("print('hi')", 5) == "ok", "a child that exits with 0 should give 'ok'")
    got = run_with_timeout("import sys; sys.exit(3)", 5)
    expect(got == "error", f"a child that exits with 3 gave {got!r}: any non-zero return code is 'error'")
    started = time.monotonic()
    try:
        got = run_with_timeout("import time; time.sleep(30)", 0.5)
    except subprocess.TimeoutExpired:
        raise Feedback("TimeoutExpired escaped from run_with_timeout: catch it and return 'timed_out'") from None
    took = time.monotonic() - started
    expect(got == "timed_out", f"a child that sleeps past the deadline gave {got!r}, not 'timed_out'")
    expect(took < 5, f"run_with_timeout took {took:.1f} s for a 0.5 s deadline: pass timeout=seconds to subprocess.run")
    return "three outcomes, and a slow child never crashes the caller"
check("run_with_timeout", test)
""")

md("""
## Common mistakes

* **Catching `Exception` around everything and calling it a timeout.** A missing interpreter (`FileNotFoundError`)
  is not a timeout; catch `subprocess.TimeoutExpired` by name.
* **Reporting a timeout as `"error"`.** The student deserves to know their code was too slow, not that it was wrong.
* **Using `Popen(...).wait(timeout=...)` and forgetting to kill.** `wait` raises on timeout but leaves the child
  running; `run` kills it for you.

## Try this next

* Time how long `run_with_timeout("import time; time.sleep(30)", 0.5)` really takes with `time.monotonic()`.
* What happens with `timeout=0`?

## The real thing

`cellbox.sandbox` keeps a wall-clock deadline in the parent (the `wall_time` limit) and reports
`status == "timed_out"` in the `Outcome`, never an exception. Lesson 6 adds the second clock.
""")
