lesson(6, "both-clocks", "Both clocks")

md("""
# Lesson 6: both clocks

**Goal:** stop both kinds of runaway child, the one that spins and the one that waits, by watching two clocks.

**The plan.** A process has two times: **wall time** (seconds on the clock on the wall, since it started) and
**CPU time** (seconds a processor actually spent running it). We measure both for a child that computes and a
child that sleeps. Then we see that `RLIMIT_CPU` (lesson 5) cannot stop a sleeper or a child blocked on a socket,
and that a wall deadline alone leaves the operating system out of the loop. The fix is to use both.

```mermaid
flowchart LR
    S["spinning loop<br/>CPU time grows"] -->|"RLIMIT_CPU: SIGXCPU"| K[stopped]
    W["sleep / blocked socket<br/>CPU time stays near 0"] -->|"parent's wall deadline: kill"| K
```
""")

md("""
## 1. Two clocks, measured

`resource.getrusage(resource.RUSAGE_CHILDREN)` tells how much CPU our finished children used in total. We read it
before and after each run, and compare with a wall clock (`time.monotonic()`).
""")

code("""
import resource, subprocess, sys, time

def clocks(code):
    \"\"\"Run `code`; return (wall seconds, CPU seconds) it used.\"\"\"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return time.monotonic() - started, cpu

for name, code in [("spinning", "import time\\nend = time.process_time() + 1\\nwhile time.process_time() < end: pass"),
                   ("sleeping", "import time; time.sleep(1)")]:
    wall, cpu = clocks(code)
    print(f"{name}: wall {wall:.2f} s, CPU {cpu:.2f} s")
""")

md("""
Both took a second or more on the wall; only the spinner used a second of CPU (it spins until its own CPU clock,
`time.process_time()`, has moved a second; on a busy machine its wall time is longer, because it waits its turn
for a processor). Sleeping, waiting for input, waiting on a network connection or a lock: all of these burn
**no CPU**.

## 2. The failure: `RLIMIT_CPU` alone does not stop a sleeper

Here a child that "hangs" for 3 seconds under a 1-second CPU limit. It is not stopped: it simply finishes after
3 seconds. A child that waits forever (`time.sleep(10**9)`, `input()` on a pipe nobody writes, a socket that never
answers) would make us wait forever too.
""")

code("""
def cap_cpu_1s():
    resource.setrlimit(resource.RLIMIT_CPU, (1, 2))

started = time.monotonic()
result = subprocess.run([sys.executable, "-c", "import time; time.sleep(3); print('still here')"],
                        capture_output=True, text=True, preexec_fn=cap_cpu_1s)
print(f"after {time.monotonic() - started:.1f} s: returncode {result.returncode}, said {result.stdout.strip()!r}")
""")

md("""
And a child blocked on a socket: it waits to receive from a connection whose other end never sends. Only a
**wall-clock deadline** can stop it, here `timeout=1`.
""")

code("""
blocked = '''
import socket
ours, theirs = socket.socketpair()
ours.recv(1)          # nobody will ever send: blocks, using no CPU at all
'''
try:
    subprocess.run([sys.executable, "-c", blocked], capture_output=True, preexec_fn=cap_cpu_1s, timeout=1)
except subprocess.TimeoutExpired:
    print("stopped by the wall clock after 1 s; RLIMIT_CPU never fired")
""")

md("""
## 3. Why not the wall clock alone?

* The CPU limit is enforced **by the kernel**, in the child, even if our parent program is busy, stuck or dead.
* A child with several threads burns CPU faster than the wall clock runs: on a machine shared by many
  students, CPU seconds are what you want to ration.
* It tells you *what kind* of runaway it was: `cpu_limit` ("your loop never ends") is more useful feedback than
  `timed_out` ("something was slow").

So: `RLIMIT_CPU` stops spinning, the wall deadline stops waiting. Use both, and give the wall deadline a little
more than the CPU limit so a spinning child is reported as `cpu_limit`, not `timed_out`.

## 4. Exercise: `run_both_clocks`

Write `run_both_clocks(code, cpu, wall)` that runs `code` in a new Python process with `RLIMIT_CPU` at `cpu`
seconds (hard limit one more) and a wall deadline of `wall` seconds, and returns `"ok"`, `"error"`,
`"cpu_limit"` (killed by `SIGXCPU` or `SIGKILL`) or `"timed_out"` (the wall deadline passed).
""")

exercise("run_both_clocks", """
import resource, signal, subprocess, sys

def run_both_clocks(code, cpu, wall):
    \"\"\"Run `code` under a CPU limit (s) and a wall deadline (s); return ok/error/cpu_limit/timed_out.\"\"\"
    ### BEGIN SOLUTION
    def limit():
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, preexec_fn=limit, timeout=wall)
    except subprocess.TimeoutExpired:
        return "timed_out"
    if result.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"
    return "ok" if result.returncode == 0 else "error"
    ### END SOLUTION
""")

check("run_both_clocks", """
import os, resource, tempfile, time

# A spinner that stops by itself after 2 s of CPU: past a 1 s CPU limit, but never hanging the check.
SPIN_2S = "import time\\nend = time.process_time() + 2\\nwhile time.process_time() < end: pass"

def test():
    # While the check runs, a setrlimit called in this notebook's own process is noted and not applied (so a
    # mistake never limits the cells after it); in the child (preexec_fn runs there) it works as usual.
    real, here, called_here = resource.setrlimit, os.getpid(), []
    def guarded(which, limits):
        if os.getpid() == here:
            called_here.append(which)
            return None
        return real(which, limits)
    resource.setrlimit = guarded
    try:
        return probe(called_here)
    finally:
        resource.setrlimit = real

def probe(called_here):
    got = run_both_clocks("print('hi')", 1, 5)
    expect(not called_here, "run_both_clocks called setrlimit in this notebook's own process, which would have "
           "changed this notebook's own limits: call it in the child through preexec_fn")
    expect(got == "ok", f"a quick child gave {got!r}, expected 'ok'")
    for status in (1, 2, 3, 4, 5):
        got = run_both_clocks(f"import os; os._exit({status})", 1, 5)
        expect(got == "error", f"a child that exits with {status} gave {got!r}: any non-zero return code is 'error'")
    got = run_both_clocks("raise KeyError('x')", 1, 5)
    expect(got == "error", f"an uncaught exception gave {got!r}, expected 'error'")
    got = run_both_clocks("import time; time.sleep(1.5)", 1, 5)
    expect(got == "ok", f"a child sleeping 1.5 s with cpu=1 and wall=5 gave {got!r}: sleeping uses no CPU, and the "
           "wall deadline is `wall`, not `cpu`")
    seen = os.path.join(tempfile.mkdtemp(prefix="lesson06-"), "limits")
    run_both_clocks(f"import resource; print(resource.getrlimit(resource.RLIMIT_CPU), file=open({seen!r}, 'w'))", 1, 5)
    said = open(seen).read().strip() if os.path.exists(seen) else "nothing (the child never ran)"
    expect(said == "(1, 2)", f"the child's RLIMIT_CPU was {said} for cpu=1, expected (1, 2): set RLIMIT_CPU in the "
           "child (preexec_fn), soft = cpu seconds, hard one second above")
    # What the kernel sends at the CPU limits, sent by the child to itself: no CPU spent to see how it is read.
    for name, meaning in (("SIGXCPU", "the soft CPU limit"), ("SIGKILL", "the hard CPU limit, which a child that "
                                                                        "ignores SIGXCPU meets")):
        got = run_both_clocks(f"import os, signal; os.kill(os.getpid(), signal.{name})", 1, 5)
        expect(got == "cpu_limit", f"a child killed by {name} (what {meaning} sends) gave {got!r}: count both "
               "-signal.SIGXCPU and -signal.SIGKILL as cpu_limit")
    for name in ("SIGSEGV", "SIGTERM"):
        got = run_both_clocks("import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                              f"os.kill(os.getpid(), signal.{name})", 1, 5)
        expect(got == "error", f"a child that died of {name} gave {got!r}: only SIGXCPU and SIGKILL mean the CPU "
               "limit, so compare the return code with those two, not with `< 0`; any other end is 'error'")
    got = run_both_clocks(SPIN_2S, 1, 10)
    expect(got == "cpu_limit", f"a child spinning for 2 s of CPU with cpu=1 and wall=10 gave {got!r}: set RLIMIT_CPU "
           "in the child (preexec_fn)")
    with deadline(4, "a sleeping child with wall=1 was still running 4 s later: RLIMIT_CPU never stops a sleeper, "
                  "so pass timeout=wall"):
        got = run_both_clocks("import time; time.sleep(60)", 1, 1)
    expect(got == "timed_out", f"a sleeping child with wall=1 gave {got!r}: sleeping uses no CPU, only the wall clock sees it")
    return "spinning stops at the CPU limit, waiting at the wall deadline"
check("run_both_clocks", test)
""")

md("""
## 5. Exercise: which clock stops it?

Each case below is a call `run_both_clocks(code, cpu, wall)`. Predict, **without running them**, what each returns:
`"ok"`, `"error"`, `"cpu_limit"` or `"timed_out"`.
""")

exercise("which_clock", """
SPIN = "while True: pass"
FAMILY = ("import subprocess, sys\\n"
          "child = 'import time\\\\nend = time.process_time() + 0.8\\\\nwhile time.process_time() < end: pass'\\n"
          "kids = [subprocess.Popen([sys.executable, '-c', child]) for _ in range(4)]\\n"
          "for kid in kids: kid.wait()\\n")
CASES = {
    "a": (SPIN, 1, 30),
    "b": (SPIN, 5, 1),
    "c": ("import time; time.sleep(60)", 1, 2),
    "d": (FAMILY, 1, 30),
}

def which_clock():
    \"\"\"For each case: what run_both_clocks(code, cpu, wall) returns.\"\"\"
    ### BEGIN SOLUTION
    return {
        "a": "cpu_limit",  # spins into the CPU limit long before the wall deadline
        "b": "timed_out",  # the wall deadline (1 s) comes before the CPU limit (5 s): reported as timed_out
        "c": "timed_out",  # sleeping burns no CPU; only the wall clock sees it
        "d": "ok",  # 3.2 s of CPU in all, but RLIMIT_CPU is per process and each child uses 0.8 s
    }
    ### END SOLUTION
""")

check("which_clock", f"""
ANSWERS = {hashed('which_clock', {"a": "cpu_limit", "b": "timed_out", "c": "timed_out", "d": "ok"})}
WHY = {{"a": "which comes first for a spinning loop: the 1 s CPU limit or the 30 s wall deadline?",
       "b": "a wall deadline shorter than the CPU limit: which clock reaches its limit first?",
       "c": "does sleeping use CPU? which clock can stop it?",
       "d": "RLIMIT_CPU is per process, not per family: how much CPU does each child use, against its own 1 s?"}}

def test():
    guesses = which_clock()
    expect(isinstance(guesses, dict) and set(guesses) == set(CASES), "which_clock() should return a dict with one entry per case: a to d")
    for key in wrong_keys("which_clock", guesses, ANSWERS):
        raise Feedback(f"case {{key}}: {{guesses[key]!r}} is not what run_both_clocks returns: {{WHY[key]}}")
    return "you can tell which clock will speak"
check("which_clock", test)
""")

md("""
## 6. Exercise: how long did it run?

Write `how_long(code)`: run `code` in a child and return how many seconds it took on the wall, from start to exit,
as a float. Which clock? Not the child's CPU time (a sleeper shows almost none), and not `time.time()`, which jumps
when someone sets the system clock: `time.monotonic()` only ever moves forward.
""")

exercise("how_long", """
import subprocess, sys, time

def how_long(code):
    \"\"\"Seconds on the wall (float) a child running `code` took, from its start to its exit.\"\"\"
    ### BEGIN SOLUTION
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    return time.monotonic() - started
    ### END SOLUTION
""")

check("how_long", """
import datetime as _datetime, os, tempfile, time

REAL_DATETIME = _datetime.datetime

class Jumping(_datetime.datetime):
    \"\"\"A datetime whose now() jumps an hour at every look, as if someone set the system clock.\"\"\"
    looks = 0
    @classmethod
    def now(cls, tz=None):
        Jumping.looks += 1
        return REAL_DATETIME.now(tz) + _datetime.timedelta(hours=Jumping.looks)
    @classmethod
    def utcnow(cls):
        return cls.now()
    @classmethod
    def today(cls):
        return cls.now()

def clock_set_meanwhile():
    \"\"\"how_long("pass") while the system clock jumps (time.time, time.time_ns, datetime's now).\"\"\"
    saved = time.time, time.time_ns, _datetime.datetime
    names = [name for name, value in globals().items() if value is _datetime.datetime and name != "REAL_DATETIME"]
    jumps = iter(range(1, 10**6))
    time.time = lambda: saved[0]() + 3600 * next(jumps)
    time.time_ns = lambda: saved[1]() + 3600 * 10**9 * next(jumps)
    _datetime.datetime = Jumping
    for name in names:
        globals()[name] = Jumping
    try:
        return how_long("pass")
    finally:
        time.time, time.time_ns, _datetime.datetime = saved
        for name in names:
            globals()[name] = saved[2]

def test():
    flag = os.path.join(tempfile.mkdtemp(prefix="lesson06-"), "done")
    with deadline(10, "how_long of a 1 s sleeper was still running 10 s later"):
        took = how_long(f"import time; time.sleep(1); open({flag!r}, 'w').close()")
    ended = os.path.exists(flag)
    time.sleep(0 if ended else 1.5)
    expect(ended or not os.path.exists(flag), "how_long returned before the child exited: wait for it "
           "(subprocess.run waits) before you read the clock again")
    expect(isinstance(took, float), f"how_long should return seconds as a float, not {type(took).__name__}")
    expect(took >= 0.9, f"a child that slept 1 s took {took:.2f} s by your measure: measuring how long it ran with "
           "CPU time; sleeping uses no CPU, so read the wall clock (time.monotonic())")
    expect(took < 10, f"a child that slept 1 s took {took:.2f} s by your measure, expected about 1")
    took = clock_set_meanwhile()
    expect(isinstance(took, float) and took < 10, f"with the system clock set forward meanwhile, a quick child took "
           f"{took:.0f} s by your measure: time.time() jumps when the clock is set, and so does datetime.now(); "
           "time.monotonic() never does")
    return "a monotonic wall clock measures sleepers and spinners alike"
check("how_long", test)
""")

md("""
## Common mistakes

* **A wall deadline shorter than the CPU limit.** The spinner is then always reported as `timed_out`, and the
  CPU limit never speaks (the second exercise).
* **Measuring "how long it ran" with CPU time.** A sleeping child shows almost 0 s of CPU (the third exercise);
  use a monotonic wall clock (`time.monotonic()`, never `time.time()`, which jumps when the system clock is set).
* **Thinking RLIMIT_CPU is per family.** It is per process: a child that starts 50 spinning children gets 50
  times the CPU. Lesson 7 makes sure the whole family ends with the run; rationing the CPU of a family as a whole
  needs a cgroup (`cpu.max`), one of the walls of lesson 12. (The second exercise shows it.)

## Try this next

* Spin in two threads at once (`threading.Thread`) and compare wall and CPU time. (In Python, the GIL keeps
  pure-Python threads from running truly in parallel; try `hashlib.sha256` on big data, which releases it.)
* What does a child blocked on `input()` do when its stdin is `subprocess.DEVNULL`?

## Key points

* Wall time is time on the clock; CPU time is time a processor spent on the process. Sleeping and waiting use no
  CPU.
* `RLIMIT_CPU` (kernel-enforced, per process) stops spinning; only the parent's wall deadline stops waiting.
* Use both, with the wall deadline above the CPU limit, so each runaway is named for what it did.

## The real thing

In `cellbox.sandbox` the parent keeps the `wall_time` deadline while `cellbox.sandbox._launch` sets `cpu_time` as
RLIMIT_CPU (soft n, hard n + 1); the `Outcome` says `cpu_limit` or `timed_out`, and `classify` puts what the parent
did first.
""")

answers("""
## Answers to "Try this next"

* Two pure-Python spinning threads: CPU time about equal to wall time (the GIL lets one run at a time). Two
  threads hashing large buffers with `hashlib.sha256` (which releases the GIL): CPU time up to twice the wall time
  on two cores. That is why a CPU limit can run out before the wall clock does.
* It does not block: `input()` reads end-of-file at once and raises `EOFError`, so the child ends with an error
  (return code 1) instead of hanging. Give children `stdin=subprocess.DEVNULL` for exactly that reason.
""")
