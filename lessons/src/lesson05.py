lesson(5, "resource-limits", "Resource limits")

md("""
# Lesson 5: resource limits

**Goal:** cap how much memory, CPU time and disk a child may use, with limits the operating system enforces.

**The plan.** We watch a child eat memory while nothing stops it. Then we meet `resource.setrlimit`, which asks
the kernel to cap one resource of one process, and set three limits *in the child*, just before it starts:
`RLIMIT_AS` (memory), `RLIMIT_CPU` (CPU seconds) and `RLIMIT_FSIZE` (file size). We see what each looks like when it
triggers, how limits pass on to grandchildren, and one trap: libraries that reserve memory up front.
""")

md("""
## 1. The failure: nothing stops a hungry child

This child allocates 50 MB at a time, six times, and prints how much it holds. (We stop at 300 MB on purpose. A
real memory bomb keeps going until the machine swaps and everything on it, your notebook included, freezes.)
""")

code("""
import subprocess, sys

hungry = '''
chunks = []
for i in range(6):
    chunks.append(bytearray(50 * 1024 * 1024))
    print(f"holding {50 * (i + 1)} MB", flush=True)
'''
result = subprocess.run([sys.executable, "-c", hungry], capture_output=True, text=True)
print(result.stdout, "returncode:", result.returncode)
""")

md("""
## 2. `setrlimit`: limits the kernel enforces

`resource.setrlimit(resource.RLIMIT_AS, (soft, hard))` limits the **address space** of the calling process, in
bytes. Past the soft limit, the kernel refuses to give more memory: `malloc` fails and Python raises
`MemoryError`, long before the machine has to swap.

The limit has to be set **in the child**, not in our notebook. The simplest way is `preexec_fn`: a function
`subprocess` calls in the child after it has been created and before it starts the new program. (Lesson 8 shows
why `preexec_fn` is dangerous in a program with threads, and replaces it; for now it keeps things short.)
""")

code("""
import resource

MB = 1024 * 1024

def cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (200 * MB, 200 * MB))

result = subprocess.run([sys.executable, "-c", hungry], capture_output=True, text=True, preexec_fn=cap_memory)
print(result.stdout, "returncode:", result.returncode)
print("last line of stderr:", result.stderr.strip().splitlines()[-1])
""")

md("""
The child got a `MemoryError` at about 150 MB (the interpreter itself uses some of the 200 MB of address space),
and our notebook did not notice a thing.

## 3. CPU seconds: `RLIMIT_CPU`

`RLIMIT_CPU` counts **CPU seconds** the process has used. At the soft limit the kernel sends `SIGXCPU`, which
ends the process unless it handles the signal; at the hard limit it sends `SIGKILL`, which cannot be handled.
So we set the hard limit one second above the soft one: a child that ignores `SIGXCPU` still dies a second later.
A process killed by a signal has a **negative return code** in Python: `-signal number`.
""")

code("""
import signal

def cap_cpu():
    resource.setrlimit(resource.RLIMIT_CPU, (1, 2))

result = subprocess.run([sys.executable, "-c", "while True: pass"], capture_output=True, text=True, preexec_fn=cap_cpu, timeout=10)
print("returncode:", result.returncode, "=", signal.Signals(-result.returncode).name)
""")

md("""
## 4. File size: `RLIMIT_FSIZE`

`RLIMIT_FSIZE` is the largest file a process may write. Python ignores the `SIGXFSZ` signal the kernel sends at
the limit, so the write fails with `OSError: [Errno 27] File too large` instead.
""")

code("""
import tempfile, os

def cap_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 * MB, 1 * MB))

target = os.path.join(tempfile.mkdtemp(prefix="lesson05-"), "big.bin")
writer = f"open({target!r}, 'wb').write(bytes(2 * 1024 * 1024))"
result = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True, preexec_fn=cap_file_size)
print("last line of stderr:", result.stderr.strip().splitlines()[-1])
print("the file stopped at", os.path.getsize(target), "bytes")
os.remove(target)
""")

md("""
## 5. Limits are per process, and inherited

Each limit belongs to **one process** (RLIMIT_AS is not the total of a family). A child *inherits* its parent's
limits when it is created (`fork`) and keeps them when it starts another program (`exec`). So a limit set in the
child also holds for everything the child starts: the shell below is a grandchild, and `ulimit -v` (in KiB) shows it
inherited our 200 MB.

Lowering a limit needs no privilege: any process may tighten its own box. Raising a **hard** limit needs the
capability `CAP_SYS_RESOURCE`. Root usually has it (a reason never to run students' code as root), but a
container often drops it, and then even root is refused. The cell prints who it runs as and whether it holds the
capability, so you can tell which case you are in.
""")

code("""
result = subprocess.run(["sh", "-c", "ulimit -v"], capture_output=True, text=True, preexec_fn=cap_memory)
print("the grandchild's address-space limit:", result.stdout.strip(), "KiB =", int(result.stdout) // 1024, "MB")

probe = '''
import resource, os
with open("/proc/self/status") as status:
    capabilities = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
print("running as uid", os.getuid(), "| CAP_SYS_RESOURCE:", bool(capabilities & (1 << 24)))
resource.setrlimit(resource.RLIMIT_CPU, (5, 5))          # lowering: always allowed
try:
    resource.setrlimit(resource.RLIMIT_CPU, (50, 50))    # raising the hard limit
    print("raised it again: this process holds CAP_SYS_RESOURCE")
except ValueError as error:
    print("raising the hard limit was refused:", error)
'''
print(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout)
""")

md("""
## 6. The trap: memory reserved up front

`RLIMIT_AS` counts **address space**, not memory really used. Some libraries reserve big ranges at start-up:
BLAS libraries allocate work buffers (one per thread), JIT compilers reserve code areas, the JVM reserves its heap.
Under a tight `RLIMIT_AS` their *import* fails, though they would have used little. Here NumPy (with its
OpenBLAS) under 80 MB and under 200 MB; the cell also prints `OPENBLAS_NUM_THREADS`, which sets how many threads,
and so how many buffers, OpenBLAS starts with.
""")

code("""
import importlib.util, os

def cap_80():
    resource.setrlimit(resource.RLIMIT_AS, (80 * MB, 80 * MB))

print("OPENBLAS_NUM_THREADS here:", os.environ.get("OPENBLAS_NUM_THREADS", "not set (one thread per CPU)"))
if importlib.util.find_spec("numpy") is None:
    print("numpy is not installed here; skip this demonstration")
else:
    for label, limit in [("80 MB", cap_80), ("200 MB", cap_memory)]:
        result = subprocess.run([sys.executable, "-c", "import numpy; print('numpy imported')"],
                                capture_output=True, text=True, preexec_fn=limit, timeout=30)
        said = (result.stdout + result.stderr).strip().splitlines()
        print(f"{label:>7}: returncode {result.returncode}, {said[-1] if said else ''}")
""")

md("""
Under 80 MB the import fails, most likely with OpenBLAS saying that its memory allocation failed (or with a
`MemoryError`, depending on the NumPy build); under 200 MB it works. Even with `OPENBLAS_NUM_THREADS=1` (the
cellbox kernel sets it for every cell) one work buffer plus the interpreter does not fit in 80 MB: the number of
threads decides how many buffers, not whether there is one. Two ways out: a limit generous enough for the libraries
you allow (with `OPENBLAS_NUM_THREADS=1`, so that it does not grow with the number of CPUs), or a limit on **real**
memory instead of address space, with a **cgroup**, for example
`systemd-run --user --scope -p MemoryMax=256M python script.py`. A cgroup counts pages actually used and can limit
a whole family of processes together, but it needs systemd or write access to `/sys/fs/cgroup`: more set-up.

## 7. Exercise: `run_limited`

Write `run_limited(code, memory, cpu)` that runs `code` in a new Python process with `RLIMIT_AS` at `memory`
bytes and `RLIMIT_CPU` at `cpu` seconds (hard limit one more), and returns:

* `"memory_limit"` when the last line of stderr starts with `MemoryError`,
* `"cpu_limit"` when the child was killed by `SIGXCPU` or `SIGKILL`,
* `"ok"` for return code 0, else `"error"`.
""")

exercise("run_limited", """
import resource, signal, subprocess, sys

def run_limited(code, memory, cpu):
    \"\"\"Run `code` with RLIMIT_AS=`memory` bytes and RLIMIT_CPU=`cpu` s; return ok/error/memory_limit/cpu_limit.\"\"\"
    ### BEGIN SOLUTION
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit)
    lines = result.stderr.strip().splitlines()
    if lines and lines[-1].startswith("MemoryError"):
        return "memory_limit"
    if result.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"
    return "ok" if result.returncode == 0 else "error"
    ### END SOLUTION
""")

check("run_limited", """
import os, resource, tempfile

MB = 1024 * 1024

def limits_here():
    return resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)

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
    before = limits_here()
    got = run_limited("print('fine')", 200 * MB, 2)
    if called_here or limits_here() != before:
        raise Feedback("run_limited called setrlimit in this notebook's own process, which would have changed this "
                       "notebook's own limits (and every later cell's): call it in the child through preexec_fn")
    expect(got == "ok", f"a small, quick child gave {got!r}, expected 'ok'")
    seen = os.path.join(tempfile.mkdtemp(prefix="lesson05-"), "limits")
    reader = ("import resource; print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU), "
              f"file=open({seen!r}, 'w'))")
    got = run_limited(reader, 200 * MB, 2)
    said = open(seen).read().strip() if os.path.exists(seen) else ""
    unlimited = str((resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    expect(said != "", f"a child that reads its own limits gave {got!r} and never ran: is the preexec_fn failing?")
    expect(said.split(") (")[0] + ")" == str((200 * MB, 200 * MB)),
           f"the child's RLIMIT_AS was {said.split(') (')[0]}), expected (200 MB, 200 MB) in bytes: "
           "setrlimit(resource.RLIMIT_AS, (memory, memory)) in the child")
    cpu = said.split(") (")[1].rstrip(")")
    expect("(" + cpu + ")" != unlimited, "the child had no CPU limit at all (RLIMIT_CPU unlimited): set "
           "setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1)) in the child too")
    expect("(" + cpu + ")" != str((2, 2)), "the hard CPU limit should be one second above the soft one, (cpu, cpu + 1): "
           "with soft and hard equal the child gets SIGKILL with no SIGXCPU warning")
    expect("(" + cpu + ")" == str((2, 3)), f"the child's RLIMIT_CPU was ({cpu}) for cpu=2, expected (2, 3): "
           "soft = cpu seconds, hard one second above")
    got = run_limited("x = bytearray(400 * 1024 * 1024)", 200 * MB, 2)
    expect(got == "memory_limit", f"allocating 400 MB under a 200 MB limit gave {got!r}: is RLIMIT_AS set in the child?")
    # A spinner that stops by itself after 2 s of CPU: past a 1 s CPU limit, but never hanging the check.
    spin = "import time\\nend = time.process_time() + 2\\nwhile time.process_time() < end: pass"
    got = run_limited(spin, 200 * MB, 1)
    expect(got == "cpu_limit", f"a spinning loop under a 1 s CPU limit gave {got!r}: did you check for -signal.SIGXCPU?")
    # What the kernel sends at the hard CPU limit, to a child that ignores SIGXCPU, sent by the child to itself.
    got = run_limited("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 200 * MB, 1)
    expect(got == "cpu_limit", f"a child killed by SIGKILL gave {got!r}: a child that ignores SIGXCPU is killed with "
           "SIGKILL at the hard limit, so count -signal.SIGKILL as cpu_limit too")
    for name in ("SIGSEGV", "SIGTERM", "SIGABRT"):
        got = run_limited("import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                          f"os.kill(os.getpid(), signal.{name})", 200 * MB, 2)
        expect(got == "error", f"a child that died of {name} gave {got!r}: only SIGXCPU and SIGKILL mean the CPU "
               "limit, so compare the return code with those two, not with `< 0`; any other end is 'error'")
    for status in (1, 2, 3, 4, 5):
        got = run_limited(f"import os; os._exit({status})", 200 * MB, 2)
        expect(got == "error", f"a child that exits with {status} gave {got!r}, expected 'error'")
    got = run_limited("import sys; sys.exit('no MemoryError here')", 200 * MB, 2)
    expect(got == "error", f"a child whose error message merely mentions MemoryError gave {got!r}: look at how "
           "the last line of stderr starts (the exception that ended the child), not whether it says MemoryError")
    got = run_limited("1 / 0", 200 * MB, 2)
    expect(got == "error", f"a ZeroDivisionError gave {got!r}, expected 'error'")
    return "memory and CPU capped by the kernel, and each limit named"
check("run_limited", test)
""")

md("""
## 8. Exercise: predict the limit

Each program below runs under `run_limited(code, 200 * MB, 1)`. Predict, **without running them**, what
`run_limited` returns for each: `"ok"`, `"error"`, `"memory_limit"` or `"cpu_limit"`.
""")

exercise("predict_limits", """
PROGRAMS = {
    "a": "x = bytearray(100 * 1024 * 1024)",
    "b": "x = bytearray(195 * 1024 * 1024)",
    "c": "import time; time.sleep(3)",
    "d": "x = 0\\nwhile True: x += 1",
    "e": "x = [0] * 10**9",
    "f": "import time\\nend = time.monotonic() + 0.3\\nwhile time.monotonic() < end: pass",
}

def predict_limits():
    \"\"\"For each program: what run_limited(code, 200 * MB, 1) returns.\"\"\"
    ### BEGIN SOLUTION
    return {
        "a": "ok",  # 100 MB plus the interpreter fits in 200 MB
        "b": "memory_limit",  # the interpreter needs address space too: 195 MB more no longer fits
        "c": "ok",  # sleeping uses no CPU time: RLIMIT_CPU never fires
        "d": "cpu_limit",  # spins until SIGXCPU
        "e": "memory_limit",  # a list of a billion references is 8 GB
        "f": "ok",  # spins, but only for 0.3 s of CPU
    }
    ### END SOLUTION
""")

check("predict_limits", f"""
ANSWERS = {hashed("predict_limits", {"a": "ok", "b": "memory_limit", "c": "ok", "d": "cpu_limit", "e": "memory_limit", "f": "ok"})}
WHY = {{"a": "how much address space do 100 MB and the interpreter need together?",
       "b": "RLIMIT_AS counts the interpreter's own address space too, not only the bytearray",
       "c": "does sleeping use CPU time? RLIMIT_CPU counts only CPU seconds (the wall clock is lesson 6)",
       "d": "when does a loop that never ends stop using CPU?",
       "e": "how many bytes does a list of 10**9 references need (8 bytes each)?",
       "f": "how much CPU does 0.3 s of spinning use, against a 1 s limit?"}}

def test():
    guesses = predict_limits()
    expect(isinstance(guesses, dict) and set(guesses) == set(PROGRAMS),
           "predict_limits() should return a dict with one entry per program: a to f")
    for key in wrong_keys("predict_limits", guesses, ANSWERS):
        raise Feedback(f"program {{key}}: {{guesses[key]!r}} is not what run_limited returns: {{WHY[key]}}")
    return "you know which limit a program meets before it runs"
check("predict_limits", test)
""")

md("""
## Common mistakes

* **Calling `setrlimit` in the notebook instead of the child.** Then the limit is on *you* (and on every later
  child), and cannot be raised again without `CAP_SYS_RESOURCE`: the next call that asks for more fails with
  `ValueError: not allowed to raise maximum limit`.
* **Soft and hard CPU limits equal.** Then the child gets `SIGKILL` straight away, with no `SIGXCPU` warning it
  could use to save its work. One second apart gives a warning and still guarantees the kill.
* **Expecting RLIMIT_AS to equal memory used.** It counts reserved address space, the interpreter's included;
  leave room for it (the second exercise).
* **Expecting RLIMIT_CPU to stop `time.sleep`.** Sleeping uses no CPU: that is lesson 6 (and the second exercise).

## Try this next

* Find the smallest `RLIMIT_AS` at which `python -c "pass"` still starts.
* Set `RLIMIT_NOFILE` to 10 and open files in a loop: which error do you get?

## Key points

* `resource.setrlimit` asks the kernel to cap one resource of one process; set it in the child, never in yourself.
* `RLIMIT_AS` (address space) turns a memory bomb into a `MemoryError`; `RLIMIT_CPU` sends `SIGXCPU` at the soft
  limit and `SIGKILL` at the hard one (so put the hard one a second higher); `RLIMIT_FSIZE` stops a file growing.
* Limits are per process and inherited across `fork` and `exec`; lowering is free, raising a hard limit needs
  `CAP_SYS_RESOURCE`.
* `RLIMIT_AS` counts reserved address space: libraries that reserve up front need room, or a cgroup limit instead.

## The real thing

`cellbox.sandbox.limits.Limits` defines every limit once (`memory` is RLIMIT_AS, `cpu_time` is RLIMIT_CPU with the hard
limit one second above, `file_size` is RLIMIT_FSIZE), and `cellbox.sandbox._launch` applies them in the child.
""")

answers("""
## Answers to "Try this next"

* Search downwards, for example with `run_limited("pass", n * MB, 5)` for smaller and smaller `n`: a plain CPython
  starts in somewhere around 10 to 20 MB of address space (it depends on the build and on the libraries it maps);
  below that it fails before running anything, with a `MemoryError` or a `Fatal Python error` at start-up.
* `OSError: [Errno 24] Too many open files` once the process holds 10 descriptors: stdin, stdout and stderr count
  too, so only 7 `open` calls succeed.
""")
