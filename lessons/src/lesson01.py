lesson(1, "separate-process", "A separate process")

md("""
# Lesson 1: a separate process

**Goal:** run a piece of untrusted Python in its own process and read back whether it worked and what it printed.

**The plan.** First we watch what goes wrong when someone else's code runs *inside* our program with `exec`.
Then we hand the same code to a brand-new Python process with `subprocess.run`, capture what it prints,
and read its exit status. At the end you write `run_isolated(code)`, the first brick of the sandbox that
the rest of the course builds on.

```mermaid
flowchart LR
    A[your program] -- "code as text" --> B["new process:<br/>python -c code"]
    B -- "stdout, stderr, returncode" --> A
```
""")

md("""
## 1. The problem: `exec` runs code *as you*

`exec(text)` runs text as Python in the current interpreter. That is the same process, the same memory,
the same variables. Here is a harmless-looking snippet from a student that quietly changes our program.
""")

code("""
import builtins

scores = {"ada": 9, "bob": 7}
student_code = '''
import builtins
scores["bob"] = 10                       # edits our data
builtins.print = lambda *a, **k: None    # and silences print for everyone
'''

real_print = builtins.print   # we keep the real print, so we can repair the damage below
exec(student_code, {"scores": scores})
print("can you see me?")      # nothing appears: print is gone
builtins.print = real_print
print("print is back; bob now has", scores["bob"])
""")

md("""
The first `print` showed nothing: the student's code replaced `print` for the **whole interpreter**, and `bob`
now has 10. We could only repair it because we had kept the real `print` beforehand. Code run with `exec` or
`eval` can read and change anything your program can: your variables, your modules, your files.
""")

md("""
## 2. The fix: a new process

A **process** has its own memory. If the student's code runs in another process, it can change *that*
process's `print`, not ours. `subprocess.run` starts a program and waits for it:

* `[sys.executable, "-c", code]` is the command: this very Python interpreter, told to run `code`.
* `capture_output=True` collects what the child writes to stdout and stderr instead of letting it reach the screen.
* `text=True` decodes those bytes into `str`.
""")

code("""
import subprocess, sys

child_code = '''
import builtins
print("hello from the child")
builtins.print = lambda *a, **k: None    # the same trick as before
'''
result = subprocess.run([sys.executable, "-c", child_code], capture_output=True, text=True)
print("returncode:", result.returncode)
print("stdout:", repr(result.stdout))
print("stderr:", repr(result.stderr))
print("our own print still works")
""")

md("""
The child replaced *its own* `print` after printing; ours is untouched. `result` is a `CompletedProcess` with three
things worth reading:

* `returncode`: `0` means success. Anything else means failure (Python exits with `1` on an uncaught exception).
* `stdout` and `stderr`: everything the child printed, as strings.

Now a child that fails:
""")

code("""
result = subprocess.run([sys.executable, "-c", "1 / 0"], capture_output=True, text=True)
print("returncode:", result.returncode)
print("last line of stderr:", result.stderr.strip().splitlines()[-1])
""")

md("""
The `ZeroDivisionError` happened in the child; our program just received a number and some text.
That is the whole idea of this course: **failures stay on the other side of a process boundary.**

### Why `sys.executable` and not `"python3"`?

`"python3"` is looked up on `PATH`, and may be another interpreter entirely: the system Python, without the packages
of your virtual environment, or a different version. `sys.executable` is the absolute path of the interpreter
running *this* notebook, so the child sees the same Python and the same installed packages.
""")

code("""
import shutil
print("this interpreter:      ", sys.executable)
print("'python3' on PATH is:  ", shutil.which("python3"))
""")

md("""
## 3. Exercise: `run_isolated`

Write `run_isolated(code)` that runs `code` in a new Python process and returns a tuple
`(succeeded, stdout, stderr)`, where `succeeded` is `True` exactly when the child's return code is 0.
""")

exercise("run_isolated", """
import subprocess, sys

def run_isolated(code):
    \"\"\"Run Python source `code` in a new process; return (succeeded: bool, stdout: str, stderr: str).\"\"\"
    ### BEGIN SOLUTION
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.returncode == 0, result.stdout, result.stderr
    ### END SOLUTION
""")

check("run_isolated", """
def test():
    ok, out, err = run_isolated("print(6 * 7)")
    expect(ok is True, f"run_isolated returned {ok!r} for code that succeeds: did you compare returncode with 0?")
    expect(out == "42\\n", f"stdout should be '42\\\\n' but was {out!r}: did you pass capture_output=True and text=True?")
    ok, out, err = run_isolated("raise SystemExit('bye')")
    expect(ok is False, "run_isolated said a child that exits with status 1 succeeded: only returncode 0 is success")
    expect("bye" in err, "the child's error message should be in stderr: capture it and return it third")
    ok, _, _ = run_isolated("import builtins; builtins.print = None")
    expect(print is not None and ok, "the child's changes should stay in the child: use a new process, not exec")
    return "runs code in a new process and reports success from the return code"
check("run_isolated", test)
""")

md("""
## Common mistakes

* **Testing `if result.returncode:` the wrong way round.** `0` is success and is falsy; compare with `== 0`.
* **Forgetting `capture_output=True`.** Then `stdout` is `None` and the child's output goes straight to the screen.
* **Forgetting `text=True`.** You get `bytes` (`b'42\\n'`), which never equals a `str`.
* **Building a shell command string** (`shell=True`, `f"python -c '{code}'"`): quotes in the code break it, and
  the shell becomes a second interpreter of untrusted text. Pass a list of arguments.

## Try this next

* Pass `input="..."` to `subprocess.run` and read it in the child with `input()`.
* Run `import os; print(os.getpid(), os.getppid())` in a child and compare with `os.getpid()` here.

## The real thing

`cellbox.sandbox.run(argv, ...)` does this job for cellbox: it starts the child, streams and caps its output,
and returns an `Outcome` whose `status` is `ok` only for a clean exit. The next lessons add what it adds on top.
""")
