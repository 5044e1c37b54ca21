lesson(8, "threads-and-preexec-fn", "Threads and preexec_fn")

md("""
# Lesson 8: threads and `preexec_fn`

**Goal:** set a child's limits without running Python code between `fork` and `exec`, so that starting children
is safe from a program that has threads (a Jupyter kernel, a web server, a grading pool).

**The plan.** We look at how `subprocess` starts a program (`fork`, then `exec`) and where `preexec_fn` runs: in
the child, after `fork`, with a copy of the parent's memory but **only one thread**. We make that deadlock on
purpose (safely, with a time limit). Then we replace `preexec_fn` with a tiny **launcher** program that sets the
limits and then `exec`s the real command, and check that the limits survive `exec`.

```mermaid
sequenceDiagram
    participant P as parent (many threads)
    participant C as child (one thread)
    P->>C: fork(): copies memory, locks included
    Note over C: preexec_fn runs Python here:<br/>a lock held by another parent thread<br/>stays locked forever
    C->>C: exec(program): a new program, same process, same limits
```
""")

md("""
## 1. The failure: a lock nobody can release

A thread of ours holds a lock for a moment (a logging call, an import, a memory allocation: CPython and C libraries
take locks all the time). Meanwhile the main thread starts a child whose `preexec_fn` needs the same lock. `fork`
copied the lock **in its locked state**, but not the thread that would release it. We use `acquire(timeout=2)` so
the demonstration ends; with a plain `with lock:` the child, and `Popen` waiting for it, would hang forever.
""")

code("""
import subprocess, sys, threading, time

def hold(lock, seconds):
    \"\"\"What a busy thread does: hold `lock` for `seconds`.\"\"\"
    with lock:
        time.sleep(seconds)

lock = threading.Lock()

def preexec():
    if not lock.acquire(timeout=2):
        raise RuntimeError("deadlock: this lock's owner is a thread that does not exist in the child")

worker = threading.Thread(target=hold, args=(lock, 3))
worker.start()
time.sleep(0.1)
started = time.monotonic()
try:
    subprocess.run([sys.executable, "-c", "print('started')"], preexec_fn=preexec, capture_output=True, text=True)
except subprocess.SubprocessError as error:
    print(f"after {time.monotonic() - started:.1f} s: {type(error).__name__}: {error}")
worker.join()
# The thread has finished and nothing needs the lock any more: drop them.
del lock, worker, preexec
""")

md("""
The Python documentation says it plainly: *the `preexec_fn` parameter is NOT SAFE to use in the presence of
threads in your application; the child process could deadlock before exec is called.* A Jupyter kernel always has
threads (its heartbeat, its I/O), so does every grading pool. And "my program has no threads" is rarely true for
long: your libraries start them for you (a thread pool, a logging handler), as one call to a pool shows:
""")

code("""
import concurrent.futures

print("threads before:", threading.active_count())
pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
pool.submit(time.sleep, 0.1).result()
print("threads after one call to a pool:", threading.active_count())
pool.shutdown()
del pool   # shut down: later cells do not need it
""")

md("""
(Under the cellbox kernel the count before is 1: each cell runs in a process of its own, forked with only the
thread that runs the cell, while the kernel's own threads stay in the kernel. The pool adds its thread all the same.)

So write code that is safe with threads, whether or not you started one.

## 2. The fix: a launcher that `exec`s

`exec` replaces the program a process is running with another one, **in the same process**: same pid, same
environment, and the same resource limits. So we can start a small, single-threaded Python program (the
launcher) with plain `subprocess` (whose own work between fork and exec is done in C and is safe), let *it* call
`setrlimit`, and then `os.execvp` the real command.
""")

code("""
LAUNCHER = '''
import os, resource, sys
memory, cpu, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
os.execvp(command[0], command)      # never returns: this process now runs `command`
'''

MB = 1024 * 1024
show = "import os, resource; print('pid', os.getpid(), 'RLIMIT_AS', resource.getrlimit(resource.RLIMIT_AS)[0] // (1024 * 1024), 'MB', 'RLIMIT_CPU', resource.getrlimit(resource.RLIMIT_CPU))"
proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(256 * MB), "2", sys.executable, "-c", show],
                        stdout=subprocess.PIPE, text=True)
print("launcher pid", proc.pid)
print("after exec:  ", proc.communicate()[0].strip())
del proc
""")

md("""
The same pid before and after `exec`, and the limits the launcher set are still there. It works with threads in
the parent too, because nothing of ours runs in the child before `exec`:
""")

code("""
lock = threading.Lock()
worker = threading.Thread(target=hold, args=(lock, 3))
worker.start()
time.sleep(0.1)
result = subprocess.run([sys.executable, "-c", LAUNCHER, str(200 * MB), "2",
                         sys.executable, "-c", "x = bytearray(400 * 1024 * 1024)"], capture_output=True, text=True)
print("with a lock held by another thread, the child started and hit its limit:", result.stderr.strip().splitlines()[-1])
worker.join()
del lock, worker
""")

md("""
## 3. Exercise: `launcher_command`

Write `launcher_command(argv, memory, cpu)` returning the argument list that starts a launcher (Python with `-c`
and your own launcher source) which sets `RLIMIT_AS` to `memory` bytes (soft and hard, so the command cannot raise
it again) and `RLIMIT_CPU` to `cpu` seconds (hard limit one more) and then execs `argv`, every word of it as it is.
Do not use `preexec_fn`.
""")

exercise("launcher_command", """
import sys

def launcher_command(argv, memory, cpu):
    \"\"\"Return a command (list of str) that runs `argv` under RLIMIT_AS=`memory` bytes and RLIMIT_CPU=`cpu` s.\"\"\"
    ### BEGIN SOLUTION
    source = (
        "import os, resource, sys\\n"
        "memory, cpu = int(sys.argv[1]), int(sys.argv[2])\\n"
        "resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))\\n"
        "os.execvp(sys.argv[3], sys.argv[3:])\\n"
    )
    return [sys.executable, "-c", source, str(memory), str(cpu), *argv]
    ### END SOLUTION
""")

check("launcher_command", """
import resource

def ran(command):
    \"\"\"stdout of command, or Feedback saying how the launcher failed.\"\"\"
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        raise Feedback(f"the command {command[-3:]} was still running after 10 s: does the launcher wait for "
                       "something instead of exec'ing argv?") from None
    said = result.stderr.strip().splitlines()
    last = said[-1] if said else f"nothing on stderr, status {result.returncode}"
    expect(result.returncode == 0 or result.stdout, f"the command failed before printing anything ({last!r}): "
           + ("the launcher's source does not parse: pass argv as its arguments (sys.argv), never pasted into the source"
              if "SyntaxError" in last else "setrlimit refused a value: is the soft limit above the hard one?"
              if "ValueError" in last else "os.execv needs a path, not a bare name like echo: use os.execvp"
              if "FileNotFoundError" in last else "argv went through a shell, which reads quotes and spaces: exec argv "
              "itself, never through a shell" if last.startswith("sh:") else "a process with so little address space "
              "cannot even start: RLIMIT_AS is in bytes, so pass memory as it is, and as memory, not as cpu"
              if not said or "MemoryError" in last or "Cannot allocate memory" in last
              else "run it by hand and read its stderr"))
    return result.stdout

def limits_hint(seen, memory, cpu):
    as_soft, as_hard, cpu_soft, cpu_hard = seen
    infinity = resource.RLIM_INFINITY
    if as_soft == infinity and cpu_soft == infinity:
        return "the command saw no limit at all: set the limits before exec (nothing of the launcher runs after a successful exec)"
    if as_soft == infinity:
        return "the command saw no RLIMIT_AS: set RLIMIT_AS (the address space, not RLIMIT_DATA or RLIMIT_RSS) before exec"
    if {as_soft, as_hard} & {memory // MB, memory // 1024, cpu}:
        return "RLIMIT_AS is in bytes, and memory comes first: pass memory, then cpu, each to its own limit"
    if as_soft != memory:
        return f"the command's RLIMIT_AS was {as_soft} bytes instead of the {memory} asked for"
    if as_hard != memory:
        return "the hard RLIMIT_AS was left above the soft one, so the command may raise its own limit again: set (memory, memory)"
    if cpu_soft != cpu:
        return f"the command's soft RLIMIT_CPU was {cpu_soft} instead of the {cpu} s asked for"
    if cpu_hard != cpu + 1:
        return ("the hard CPU limit should be one second above the soft one, (cpu, cpu + 1): then SIGXCPU comes first and "
                "SIGKILL a second later")
    return None

def test():
    mine = [resource.getrlimit(which) for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU)]
    command = launcher_command(["echo", "hi"], 256 * MB, 3)
    expect([resource.getrlimit(which) for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU)] == mine,
           "launcher_command changed this notebook's own limits: only build the command here; the launcher, in the child, sets them")
    expect(isinstance(command, list) and all(isinstance(a, str) for a in command),
           "launcher_command should return a list of strings, ready for subprocess.run")
    words = ["echo", "it's", "two  words"]
    said = ran(launcher_command(words, 256 * MB, 3))
    expect(said != "two  words\\n", "the command lost its first word: exec the whole argv, os.execvp(argv[0], argv) "
           "(argv[0], the program's own name, is part of it)")
    expect(said == "it's two  words\\n", f"running {words} printed {said!r}: pass each word of argv to exec as it is, "
           "never joined into one string and split again (nor through a shell)")
    probe = "import resource as r; print(*r.getrlimit(r.RLIMIT_AS), *r.getrlimit(r.RLIMIT_CPU))"
    for memory, cpu in ((300 * MB, 7), (256 * MB, 3)):
        seen = [int(word) for word in ran(launcher_command([sys.executable, "-c", probe], memory, cpu)).split()]
        hint = limits_hint(seen, memory, cpu)
        expect(hint is None, f"with memory={memory // MB} MB and cpu={cpu} s: {hint}")
    proc = subprocess.Popen(launcher_command([sys.executable, "-c", "import os; print(os.getpid())"], 256 * MB, 3),
                            stdout=subprocess.PIPE, text=True)
    try:
        said = proc.communicate(timeout=10)[0].strip()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Feedback("the command was still running after 10 s: does the launcher wait for something instead of "
                       "exec'ing argv?") from None
    expect(said == str(proc.pid), f"the command ran as pid {said}, not as the launcher ({proc.pid}): "
           "exec it with os.execvp instead of starting it with subprocess or os.system")
    return "limits set by a launcher, then exec: no Python between fork and exec"
check("launcher_command", test)
""")

md("""
## 4. Exercise: which of these run Python between fork and exec?

Each entry is a way of starting a child with `subprocess.Popen`. Say which ones run **Python code of ours in the
child after `fork` and before `exec`** (the dangerous moment in a program with threads), by returning their keys
as a set from `unsafe_with_threads()`.
""")

exercise("unsafe_with_threads", """
WAYS = {
    "a": "Popen(argv, preexec_fn=set_limits)",
    "b": "Popen(argv, start_new_session=True)",
    "c": "Popen(argv, process_group=0)",
    "d": "Popen(argv, env={'PATH': '/usr/bin'}, cwd='/tmp')",
    "e": "Popen([sys.executable, '-c', LAUNCHER, ..., *argv])",
    "f": "Popen(argv, preexec_fn=os.setsid)",
}

def unsafe_with_threads():
    \"\"\"The keys of WAYS that run Python code in the child between fork and exec.\"\"\"
    ### BEGIN SOLUTION
    # Only preexec_fn runs Python there, even when the function is a thin wrapper such as os.setsid;
    # the session, the group, env and cwd are set by subprocess's C code; the launcher runs after exec.
    return {"a", "f"}
    ### END SOLUTION
""")

check("unsafe_with_threads", f"""
ANSWERS = {hashed("unsafe_with_threads", {key: key in {"a", "f"} for key in "abcdef"})}
WHY = {sealed("unsafe_with_threads", {
    ("a", False): "preexec_fn runs your Python function in the child before exec",
    ("b", True): "start_new_session is done by subprocess's C code between fork and exec",
    ("c", True): "process_group is done by subprocess's C code between fork and exec",
    ("d", True): "env and cwd are applied by subprocess's C code",
    ("e", True): "the launcher's Python runs after exec, in a fresh interpreter with one thread",
    ("f", False): "preexec_fn=os.setsid still calls a Python-level function in the child: use start_new_session=True",
})}

def test():
    guess = unsafe_with_threads()
    expect(isinstance(guess, set), f"unsafe_with_threads() should return a set of keys, not {{type(guess).__name__}}")
    unknown = sorted(map(repr, guess - set(WAYS)))
    expect(not unknown, f"{{', '.join(unknown)}} are not keys of WAYS: answer with the letters a to f")
    for key in wrong_keys("unsafe_with_threads", {{key: key in guess for key in WAYS}}, ANSWERS):
        truth = "safe" if key in guess else "unsafe"
        raise Feedback(f"{{key}} ({{WAYS[key]}}) is {{truth}} after all: {{unseal('unsafe_with_threads', key, key in guess, WHY, '')}}")
    return "only preexec_fn runs Python between fork and exec"
check("unsafe_with_threads", test)
""")

md("""
## Common mistakes

* **Setting the limits after `exec`.** Nothing of the launcher runs after a successful `exec`: set them first.
* **`os.system` or `subprocess.run` in the launcher instead of `exec`.** That adds a process (the launcher stays
  as a parent) and the command's return code must be passed back by hand; `exec` simply becomes the command.
* **`os.execv` with a bare name.** `execv` needs a path; `execvp` looks the name up on `PATH`.
* **`preexec_fn=os.setsid`.** Still a Python-level call between fork and exec; `start_new_session=True` does the
  same in C (the second exercise).
* **Joining `argv` into one string** (to split it again, to run it through `sh -c`, or to paste it into the
  launcher's source). A word with a space or a quote in it breaks; pass the words as arguments, as they are.
* **A soft limit only.** A process may raise its soft limit up to its hard one: set both.

## Try this next

* Start the launcher with `start_new_session=True`: the group is made in C before the launcher runs, so that is
  safe too. Check with `os.getpgid(0)` in the command.
* Python 3.12 warns (`DeprecationWarning`) when `fork` is used in a process with threads. Why might that be?

## Key points

* `preexec_fn` runs Python in the child between `fork` and `exec`, with a copy of the parent's locks but only one
  thread: in a program with threads it can deadlock.
* Instead, start a tiny single-threaded launcher that sets the limits and then `exec`s the real command.
* `exec` keeps the pid, the environment and the resource limits: limits set before `exec` hold after it.

## The real thing

`cellbox.sandbox._launch` is cellbox's launcher: a standard-library-only file the parent starts with
`python -I -S _launch.py SPEC`; it applies every limit (rlimits, nice, I/O class, optional user) and then execs the
command, while a supervisor half of it stays behind to collect the process tree (design rule 1).
""")

answers("""
## Answers to "Try this next"

* `os.getpgid(0)` in the command equals the launcher's pid (`proc.pid`), which is also the command's pid after
  `exec`: the new session and group were made by subprocess's C code, and survive `exec` like the limits.
* `fork` copies only the calling thread. Any lock another thread held (in `logging`, in an import, in `malloc`)
  stays locked forever in the child, so the child may deadlock as soon as it touches it, and Python code run
  before `exec` (or a child that never execs) touches such locks all the time. The warning points that out.
""")
