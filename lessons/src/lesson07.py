lesson(7, "kill-the-whole-group", "Kill the whole group")

md("""
# Lesson 7: kill the whole group

**Goal:** when a run ends, make sure every process it started has ended too.

**The plan.** A child may start children of its own: a server, a worker pool, a background job. We watch one
outlive the timeout that killed its parent, and watch another keep our program waiting by holding the output pipe.
Then we put the child in a **process group** of its own and kill the whole group at once. Last, a grandchild that
leaves the group with `os.setsid()` escapes even that, and we catch it as a **child subreaper**.

```mermaid
flowchart TB
    N["notebook (parent)"] --> C["child: session leader, group G"]
    C --> G1["grandchild in group G<br/>killed by os.killpg(G)"]
    C --> G2["grandchild after os.setsid()<br/>a new group: escapes killpg"]
    G2 -. "re-parented on its parent's death" .-> N
```
""")

md("""
## 1. Tools for watching processes

`alive(pid)` looks in `/proc/PID/stat`; a process that has ended but has not been collected by its parent yet is
a *zombie* (state `Z`) and counts as gone. `spawn_grandchild` is code for a child that starts a grandchild, which
prints its own pid on the stdout it shares with the child and sleeps for `seconds`; the child sleeps too.
""")

code("""
import os, signal, subprocess, sys, time

def alive(pid):
    \"\"\"True if process `pid` exists and is not a zombie.\"\"\"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"

def spawn_grandchild(seconds, child_sleeps, setsid=False):
    \"\"\"Source of a child that starts a grandchild which (optionally leaves the group,) prints its pid and sleeps.\"\"\"
    grandchild = f"import os, time; {'os.setsid(); ' if setsid else ''}print(os.getpid(), flush=True); time.sleep({seconds})"
    return (f"import subprocess, sys, time\\n"
            f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\\n"
            f"time.sleep({child_sleeps})\\n")

print(alive(os.getpid()), alive(999999999))
""")

md("""
## 2. The failure: an orphaned server outlives the timeout

The child below starts a small web server (`python -m http.server`) as its own child, as a student's program that
"just runs the app" would, and then hangs. `timeout=1` kills the **child**. The server is another process; nobody
kills it. It is re-parented (to `init`, or to the nearest subreaper) and keeps answering requests.
""")

code("""
import socket, urllib.request

with socket.socket() as probe:          # ask the system for a free port
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
starts_server = (f"import subprocess, sys, time\\n"
                 f"server = subprocess.Popen([sys.executable, '-m', 'http.server', '{port}', '--bind', '127.0.0.1'],\\n"
                 f"                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\\n"
                 f"print(server.pid, flush=True)\\n"
                 f"time.sleep(60)\\n")
try:
    subprocess.run([sys.executable, "-c", starts_server], capture_output=True, text=True, timeout=1)
except subprocess.TimeoutExpired as expired:
    orphan = int(expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout)
print(f"the child was killed at the timeout; the server {orphan} alive: {alive(orphan)}")
answer = None
for attempt in range(50):               # give the server a moment to start listening
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
            print("and it still answers HTTP requests:", answer.status, answer.reason)
        break
    except OSError:
        time.sleep(0.1)
os.kill(orphan, signal.SIGKILL)   # tidy up by hand, this time
del probe, answer   # a closed socket and a finished response: nothing later cells need
""")

md("""
Worse: a grandchild keeps a copy of the child's stdout. `subprocess.run` reads until **every** writer has closed
the pipe, so even a child that exits at once keeps us waiting as long as its grandchild lives (2 seconds here).
""")

code("""
started = time.monotonic()
subprocess.run([sys.executable, "-c", spawn_grandchild(2, 0)], capture_output=True, text=True)
print(f"the child exited at once, but run() returned after {time.monotonic() - started:.1f} s")
""")

md("""
## 3. The fix: a process group, killed as one

`start_new_session=True` makes the child call `setsid()` before it runs the program: it becomes the leader of a
new session and a new **process group** whose id is its own pid. Its children join that group unless they leave
it. `os.killpg(group, signal.SIGKILL)` signals every process in the group at once. (`process_group=0`, new in
Python 3.11, makes only a new group, without a new session.)

We use `Popen` and `communicate(timeout=...)` instead of `run` so that we can kill the group ourselves, and we kill
it **always**, also when the child ended normally: its children may still be there.
""")

code("""
proc = subprocess.Popen([sys.executable, "-c", spawn_grandchild(5, 60)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
pid_line = proc.stdout.readline()
try:
    proc.communicate(timeout=1)
except subprocess.TimeoutExpired:
    print("timed out; killing group", proc.pid)
finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
time.sleep(0.2)
print(f"grandchild {int(pid_line)} alive: {alive(int(pid_line))}")
del proc   # the process it stood for has ended; later cells do not need it
""")

md("""
### When the group is already empty

"Always kill the group" has one case to handle. When the child and all its descendants have ended **and** the
child has been collected (`communicate()` or `wait()` returned), the group no longer exists, and `os.killpg`
raises `ProcessLookupError`. That is good news (nothing was left to kill), so catch exactly that exception:
""")

code("""
proc = subprocess.Popen([sys.executable, "-c", "print('done at once')"], stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
proc.communicate()                       # the child has exited and is collected: its group is empty
try:
    os.killpg(proc.pid, signal.SIGKILL)
except ProcessLookupError as error:
    print("ProcessLookupError:", error, "-> nothing left to kill, which is what we wanted")
del proc
""")

md("""
(Until the child is collected it is a zombie: its pid, and so its group, still exist, and `killpg` succeeds.)

## 4. The escape: `os.setsid()` leaves the group

A process may start its own session at any time, and daemons do exactly that. Then it is no longer in our group,
and `killpg` misses it.
""")

code("""
proc = subprocess.Popen([sys.executable, "-c", spawn_grandchild(5, 60, setsid=True)],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
escaped = int(proc.stdout.readline())
os.killpg(proc.pid, signal.SIGKILL)
proc.wait()
time.sleep(0.2)
print(f"grandchild {escaped} after killpg, alive: {alive(escaped)}")
os.kill(escaped, signal.SIGKILL)   # we only knew its pid because it told us
del proc
""")

md("""
## 5. What catches it

Something must find descendants that left the group. Three mechanisms, from light to heavy:

* **A child subreaper** (`prctl(PR_SET_CHILD_SUBREAPER)`, Linux): orphans among our descendants are re-parented to
  *us* instead of `init`, so after the child dies we can list our own children and kill them. No privilege needed.
* **A PID namespace** (`unshare --pid --fork --kill-child`): the child is process 1 of a new namespace; when it
  dies, the kernel kills everything in the namespace. Needs privilege or a user namespace.
* **A cgroup**: every descendant stays in the cgroup whatever it does; writing `1` to `cgroup.kill` kills them
  all. Needs write access to the cgroup tree.

Here is the subreaper, set on this notebook's process with `ctypes`. The grandchild escapes the group, its parent
is killed, and it lands on us: we find it by scanning `/proc` for processes whose parent is our pid.
""")

code("""
import ctypes

PR_SET_CHILD_SUBREAPER = 36
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    print("prctl failed: errno", ctypes.get_errno())

def children_of(parent):
    \"\"\"Pids of the live processes whose parent is `parent`.\"\"\"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                found.append(int(name))
    return found

proc = subprocess.Popen([sys.executable, "-c", spawn_grandchild(5, 60, setsid=True)],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
escaped = int(proc.stdout.readline())
os.killpg(proc.pid, signal.SIGKILL)
proc.wait()
time.sleep(0.2)
strays = children_of(os.getpid())
print(f"escaped grandchild {escaped}; our children now: {strays}")
for pid in strays:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)          # we are its parent now, so we collect it
print(f"after the sweep, {escaped} alive: {alive(escaped)}")
del proc, libc
""")

md("""
Under the cellbox kernel, this cell itself runs under a supervisor that is a subreaper and sweeps like this when
the cell ends: a server started in a cell never outlives the cell.

## 6. Exercise: `run_tree`

Write `run_tree(code, wall)`: run `code` in a new Python process in its own session, capture its output, wait at
most `wall` seconds for it, then **always** kill its whole process group (an empty group raises
`ProcessLookupError`, as section 3 showed) and collect the child. Return `"ok"`,
`"error"` or `"timed_out"` (when the deadline passed before the output closed). The check starts a daemon-like
grandchild whose stdout and stderr go to `/dev/null`: your function must return at once and still kill it.
""")

exercise("run_tree", """
import os, signal, subprocess, sys

def run_tree(code, wall):
    \"\"\"Run `code` in its own process group for at most `wall` s; kill the group; return ok/error/timed_out.\"\"\"
    ### BEGIN SOLUTION
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        proc.communicate(timeout=wall)
        status = "ok" if proc.returncode == 0 else "error"
    except subprocess.TimeoutExpired:
        status = "timed_out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole group had already ended
        proc.communicate()
    return status
    ### END SOLUTION
""")

check("run_tree", """
import tempfile

def grandchild_pid(pid_file):
    for _ in range(100):
        if os.path.exists(pid_file) and open(pid_file).read():
            return int(open(pid_file).read())
        time.sleep(0.05)
    return None

def parent_of(pid_file, child_sleeps, holds_pipe):
    \"\"\"Source of a child that starts a grandchild sleeping 20 s (on the child's pipes, or not), writes its pid.

    The grandchild lives through SIGTERM (as a program may) and notes it in pid_file + ".term".\"\"\"
    quiet = "" if holds_pipe else ", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    grandchild = ("import signal, time\\n"
                  f"signal.signal(signal.SIGTERM, lambda *_: open({pid_file + '.term'!r}, 'w').write('TERM'))\\n"
                  "time.sleep(20)\\n")
    return ("import subprocess, sys, time\\n"
            f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]{quiet})\\n"
            f"open({pid_file!r}, 'w').write(str(p.pid))\\n"
            f"time.sleep({child_sleeps})\\n")

KILL_ONLY_THE_CHILD = ("proc.kill() signals only the direct child; kill the whole group with "
                       "os.killpg(proc.pid, signal.SIGKILL)")
CASES = [  # (child sleeps, grandchild holds the pipe, wanted, if run_tree hangs, if the grandchild survives)
    (30, True, "timed_out", "the grandchild still held the pipe after the deadline: " + KILL_ONLY_THE_CHILD,
     "the grandchild was still alive after run_tree timed out: " + KILL_ONLY_THE_CHILD),
    (0, False, "ok", "run_tree hung for a child that exits at once",
     "the grandchild was still alive after run_tree returned: kill the group even when the child exited"),
    (0, True, None, "forgetting the pipe: a grandchild held the child's stdout open, so keep the deadline on "
     "every communicate() before the group is killed", "the grandchild was still alive after run_tree returned: "
     "kill the group even when the child exited"),
]

def test():
    leader = os.path.join(tempfile.mkdtemp(), "leader")
    got = run_tree(f"import os; open({leader!r}, 'w').write(str(os.getpgid(0) == os.getpid()))", 5)
    expect(os.path.exists(leader) and open(leader).read() == "True", "the child is not in a process group of its own: "
           "start it with start_new_session=True; without it the child is in this notebook's group, where "
           "os.killpg(proc.pid, ...) finds no group of that number (and a kill of os.getpgid(proc.pid) would end this notebook)")
    got = run_tree("print('hi')", 5)
    expect(got == "ok", f"a quick child gave {got!r}, expected 'ok'")
    for status in (1, 3, 4):
        got = run_tree(f"import os; os._exit({status})", 5)
        expect(got == "error", f"a child that exits with {status} gave {got!r}, expected 'error'")
    got = run_tree("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 5)
    expect(got == "error", f"a child killed by a signal (returncode -9) gave {got!r}: non-zero is 'error'")
    with deadline(8, "run_tree was still waiting 5 s after a 3 s deadline for a child that prints 200 KB: read its "
                  "output with proc.communicate(timeout=wall) rather than proc.wait(), and keep a deadline on it"):
        got = run_tree("import sys; sys.stdout.write('x' * 200_000); sys.stderr.write('y' * 200_000)", 3)
    expect(got == "ok", f"a child that prints 200 KB and exits gave {got!r}: nobody read its stdout, so the pipe "
           "filled (it holds 64 KB) and the child blocked writing; read it with proc.communicate(timeout=wall), not proc.wait()")
    for child_sleeps, holds_pipe, wanted, if_hung, if_alive in CASES:
        pid_file = os.path.join(tempfile.mkdtemp(), "pid")
        try:
            try:
                with deadline(6, f"run_tree was still waiting 5 s after a 1 s deadline: {if_hung}"):
                    got = run_tree(parent_of(pid_file, child_sleeps, holds_pipe), 1)
            except Feedback:
                if os.path.exists(pid_file + ".term"):
                    raise Feedback("run_tree was still waiting after the deadline: it sent SIGTERM, which a program "
                                   "may catch or ignore (this grandchild did, and kept the pipe open): send SIGKILL") from None
                raise
            time.sleep(0.2)
            pid = grandchild_pid(pid_file)
            expect(pid is None or not alive(pid) or not os.path.exists(pid_file + ".term"), "the grandchild was still alive "
                   "after run_tree sent it SIGTERM, which a program may catch or ignore (this one did): send SIGKILL")
            expect(pid is None or not alive(pid), if_alive)
        finally:
            pid = grandchild_pid(pid_file)
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
        expect(wanted is None or got == wanted, f"a child that {'never ends' if child_sleeps else 'exits at once'} "
               f"gave {got!r} with wall=1, expected {wanted!r}")
    return "the deadline holds, full pipes are read, and nothing the child started survives"
check("run_tree", test)
""")

md("""
## 7. Exercise: who survives?

A child started with `start_new_session=True` starts one grandchild, then the parent does one of the things below
and waits a moment. Predict, **without running them**, whether the grandchild is still alive afterwards (`True`)
or not (`False`).

* `"kill"`: the parent calls `proc.kill()`.
* `"killpg"`: the parent calls `os.killpg(proc.pid, signal.SIGKILL)`.
* `"killpg_after_setsid"`: the grandchild called `os.setsid()` first; the parent calls `os.killpg(proc.pid, ...)`.
* `"subreaper_sweep"`: as the previous one, but the parent is a child subreaper and, after the child dies, kills
  every process whose parent is now itself (section 5).
* `"timeout_run"`: the parent used `subprocess.run(..., timeout=1)` and the child ran longer.
""")

exercise("survivors", """
def survivors():
    \"\"\"For each case: True if the grandchild is still alive afterwards.\"\"\"
    ### BEGIN SOLUTION
    return {
        "kill": True,  # only the direct child got the signal
        "killpg": False,  # the grandchild is in the child's group
        "killpg_after_setsid": True,  # it left the group
        "subreaper_sweep": False,  # re-parented to us, then found and killed
        "timeout_run": True,  # run() kills only the direct child at the timeout
    }
    ### END SOLUTION
""")

check("survivors", f"""
ANSWERS = {hashed("survivors", {"kill": True, "killpg": False, "killpg_after_setsid": True, "subreaper_sweep": False, "timeout_run": True})}
WHY = {{"kill": "which processes does proc.kill() signal: the direct child, or its whole family?",
       "killpg": "killpg signals every process still in the group: is the grandchild still in it?",
       "killpg_after_setsid": "after os.setsid() the grandchild is in a group of its own: does killpg of the old group reach it?",
       "subreaper_sweep": "the orphan is re-parented to the subreaper: what does the sweep do with the children it finds?",
       "timeout_run": "which process does the timeout of subprocess.run kill?"}}

def test():
    guesses = survivors()
    expect(isinstance(guesses, dict) and set(guesses) == set(ANSWERS), f"survivors() should return a dict with the keys {{sorted(ANSWERS)}}")
    for key in wrong_keys("survivors", guesses, ANSWERS):
        raise Feedback(f"{{key}}: your prediction {{guesses[key]!r}} is wrong: {{WHY[key]}}")
    return "you know which kill reaches which process"
check("survivors", test)
""")

md("""
## Common mistakes

* **`proc.kill()` instead of `os.killpg(proc.pid, ...)`.** That kills only the direct child.
* **Killing the group only on timeout.** A child that exits normally can leave a daemon behind.
* **`os.killpg(os.getpgid(proc.pid), ...)` after the child has been collected.** Once `communicate()` or `wait()`
  has reaped it, the pid is gone and `getpgid` raises `ProcessLookupError`; with `start_new_session=True` the
  group id *is* the child's pid, so use that.
* **Not catching `ProcessLookupError` from `killpg`.** A group whose every member has ended and been collected
  no longer exists; that is the good case, not an error.
* **Forgetting the pipe.** Any descendant holding stdout keeps `communicate()` waiting: keep the deadline (the
  first exercise's check leaves a grandchild holding it).
* **Thinking a group is a boundary.** Any process may leave it (`setsid`); only a subreaper, a PID namespace or a
  cgroup keeps track of every descendant.

## Try this next

* Start the web server of section 2 through your `run_tree`, then try to reach it afterwards.
* Read `/proc/self/status` in a child and find the `NSpid` line: what does it show under `unshare --pid --fork`?

## Key points

* `timeout=` and `proc.kill()` reach only the direct child; servers and pools it started live on, and any of them
  holding the output pipe keeps `communicate()` waiting.
* `start_new_session=True` puts the child in a new process group; `os.killpg(proc.pid, SIGKILL)` kills the group.
  Kill it always, and treat `ProcessLookupError` (an empty group) as success.
* A descendant that calls `os.setsid()` leaves the group: only a child subreaper, a PID namespace or a cgroup
  keeps track of every descendant.

## The real thing

`cellbox.sandbox._launch` runs every command as the leader of its own process group under a supervisor that is a child
subreaper; when the run ends it kills the group and every re-parented descendant (and, where it can, a pids cgroup
holds them all). `Outcome.killed_processes` says how many it had to kill.
""")

answers("""
## Answers to "Try this next"

* `run_tree(starts_server, 1)` returns `"timed_out"`, and afterwards `urllib.request.urlopen` to the server's port
  fails with a connection error: the server was in the child's group and died with it.
* `NSpid:` lists the process's pid in each PID namespace it belongs to, outermost first. In an ordinary child it
  has one number, the same as `Pid:`. Under `unshare -r --pid --fork` (the `-r` gives the user namespace that a
  non-root user needs) it has two: the pid seen from outside, then `1` (or a small number) inside the new namespace.
""")
