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
import os, signal, tempfile, time

def state(pid):
    \"\"\"The state letter of process `pid` (R, S, Z for a zombie...), or None once it is gone.\"\"\"
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

def test():
    expect(run_with_timeout("print('hi')", 5) == "ok", "a child that exits with 0 should give 'ok'")
    for status in (1, 2, 3, 4, 5):
        got = run_with_timeout(f"import os; os._exit({status})", 5)
        expect(got == "error", f"a child that exits with {status} gave {got!r}: any non-zero return code is 'error'")
    got = run_with_timeout("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 5)
    expect(got == "error", f"a child killed by a signal (returncode -9) gave {got!r}: a negative return code is "
           "non-zero too, 'error'; compare returncode with 0")
    pid_file = os.path.join(tempfile.mkdtemp(prefix="lesson03-"), "pid")
    # The sleeper sleeps well past this check's own deadline (4 s), which ends long before the kernel's (30 s).
    sleeper = f"import os, time; open({pid_file!r}, 'w').write(str(os.getpid())); time.sleep(20)"
    try:
        with deadline(4, "run_with_timeout was still waiting 3 s after a 1 s deadline: pass timeout=seconds to "
                      "subprocess.run (or to wait), so the call ends at the deadline"):
            got = run_with_timeout(sleeper, 1)
    finally:
        pid = int(open(pid_file).read()) if os.path.exists(pid_file) and open(pid_file).read() else None
        for _ in range(50):  # a killed child takes a moment to die; read without collecting it
            left = state(pid) if pid else None
            if left in (None, "Z"):
                break
            time.sleep(0.02)
        if left not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)
    expect(got == "timed_out", f"a child that sleeps past the deadline gave {got!r}, not 'timed_out'")
    if left == "Z":
        raise Feedback("the child was killed but never collected: it stays a zombie (state Z in /proc) until the "
                       "parent waits for it; call proc.wait() after proc.kill(), or let subprocess.run do both")
    if left is not None:
        raise Feedback("the child was still running after run_with_timeout returned: Popen.wait(timeout=...) "
                       "raises without killing it; kill it, or let subprocess.run(timeout=...) do that")
    real = sys.executable
    sys.executable = "/nonexistent/python3"
    try:
        got = run_with_timeout("pass", 5)
    except OSError:
        got = "raised"
    finally:
        sys.executable = real
    expect(got != "timed_out", "a missing interpreter came back as 'timed_out': catch subprocess.TimeoutExpired by name, not Exception")
    return "three outcomes, and a slow child never crashes the caller or outlives the call"
check("run_with_timeout", test)
""")

md("""
## 4. Exercise: fix a broken wait

Sometimes you start a child with `Popen` (to read its output as it comes, say) and wait for it later. The function
below is the third common mistake in code: `proc.wait(timeout=...)` raises `TimeoutExpired` and leaves the child
running. Fix `wait_or_kill(proc, seconds)`: wait at most `seconds`; on time-out, **kill** the child, **collect** it
(`proc.wait()` again, so that it does not stay behind as a zombie) and return `None`; otherwise return its return
code.
""")

exercise("wait_or_kill", """
import subprocess

def wait_or_kill(proc, seconds):
    \"\"\"The return code of Popen `proc` if it ends within `seconds`; else kill it, collect it, give back None.\"\"\"
    # The broken version waits with proc.wait(seconds) and, on TimeoutExpired, gives up and leaves: the child runs on.
    ### BEGIN SOLUTION
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    ### END SOLUTION
""")

check("wait_or_kill", """
import os, signal, subprocess, sys, time

def state(pid):
    \"\"\"The state letter of process `pid` (R, S, Z for a zombie...), or None once it is gone.\"\"\"
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

def test():
    for status in (0, 1, 3, 5):
        quick = subprocess.Popen([sys.executable, "-c", f"import os; os._exit({status})"])
        with deadline(10, "wait_or_kill did not return for a child that ends at once: return proc.wait(timeout=seconds)"):
            got = wait_or_kill(quick, 10)
        expect(got == status, f"a child that exits with {status} gave {got!r}: return proc.wait()'s value")
    # This child ignores SIGTERM, as a program that cleans up badly may: only SIGKILL (proc.kill()) ends it for sure.
    slow = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print(flush=True); time.sleep(20)"], stdout=subprocess.PIPE)
    slow.stdout.readline()  # it has set its handler
    try:
        with deadline(4, "wait_or_kill was still waiting 3 s after a 0.5 s deadline: pass timeout=seconds to wait, "
                      "and end the child with proc.kill() (SIGKILL: proc.terminate() sends SIGTERM, which a child can ignore)"):
            got = wait_or_kill(slow, 0.5)
        for _ in range(50):  # a killed child takes a moment to die; read without collecting it
            left = state(slow.pid)
            if left in (None, "Z"):
                break
            time.sleep(0.02)
    finally:
        if slow.returncode is None:
            slow.kill()
            slow.wait()
        slow.stdout.close()
    expect(got is None, f"a child past its deadline gave {got!r}, expected None")
    if left == "Z":
        raise Feedback("the child was killed but never collected: it stays a zombie (state Z in /proc) until the "
                       "parent waits for it; call proc.wait() after proc.kill()")
    if left is not None:
        raise Feedback("the child was still running after wait_or_kill returned: kill it when wait times out")
    expect(slow.returncode == -9, f"the child ended with {slow.returncode}, expected -9 (SIGKILL): use proc.kill()")
    return "a deadline that really ends the child, and collects it"
check("wait_or_kill", test)
""")

md("""
## Common mistakes

* **Catching `Exception` around everything and calling it a timeout.** A missing interpreter (`FileNotFoundError`)
  is not a timeout; catch `subprocess.TimeoutExpired` by name.
* **Reporting a timeout as `"error"`.** The student deserves to know their code was too slow, not that it was wrong.
* **Using `Popen(...).wait(timeout=...)` and forgetting to kill.** `wait` raises on timeout but leaves the child
  running; `run` kills it for you.
* **Killing without collecting.** After `proc.kill()` the child is dead but stays in the process table as a
  zombie (state `Z`) until its parent waits for it: call `proc.wait()` again.
* **`proc.terminate()` instead of `proc.kill()`.** SIGTERM asks; a child may ignore it. SIGKILL cannot be ignored.

## Try this next

* Time how long `run_with_timeout("import time; time.sleep(30)", 0.5)` really takes with `time.monotonic()`.
* What happens with `timeout=0`?

## Key points

* `subprocess.run(..., timeout=seconds)` kills the child at the deadline and raises `TimeoutExpired` in *your*
  program; catch it by name and report `timed_out`, a result of its own.
* `Popen.wait(timeout=...)` only raises: killing and collecting the child is then your job.
* A timeout limits how long, not what: it is one wall of the box, not a sandbox.

## The real thing

`cellbox.sandbox` keeps a wall-clock deadline in the parent (the `wall_time` limit) and reports
`status == "timed_out"` in the `Outcome`, never an exception. Lesson 6 adds the second clock.
""")

answers("""
## Answers to "Try this next"

* A little more than 0.5 s: the deadline, plus the time to kill and collect the child (a few milliseconds), plus
  the start of the interpreter that counts against the deadline too. It never waits the 30 s.
* `timeout=0` gives the child no time at all: `run` starts it, finds it still running, kills it and raises
  `TimeoutExpired` at once, so `run_with_timeout(..., 0)` says `"timed_out"` even for `"pass"`.
""")
