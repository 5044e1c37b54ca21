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
import os, shutil

print("this interpreter (sys.executable): ", sys.executable)
print("first directory on this PATH:      ", os.environ.get("PATH", "").split(os.pathsep)[0])
print("'python3' on this PATH:            ", shutil.which("python3"))
system_python = shutil.which("python3", path="/usr/bin:/bin")
print("'python3' on a PATH of /usr/bin:/bin:", system_python)

ask = "import sys, importlib.util; print(sys.prefix, importlib.util.find_spec('IPython') is not None)"
for label, python in (("sys.executable", sys.executable), ("/usr/bin python3", system_python)):
    if python:
        prefix, has_ipython = subprocess.run([python, "-c", ask], capture_output=True, text=True).stdout.split()
        print(f"{label:>16}: sys.prefix {prefix}, can import IPython: {has_ipython}")
""")

md("""
What you see depends on how this notebook was started, so the cell prints its context. Under the cellbox kernel
the cell's `PATH` starts with the directory of this very interpreter (the kernel builds the child's environment
that way, lesson 4), so the first lines may well name the same program twice. Start Python from a shell whose
`PATH` has another Python first, and `"python3"` is that other one. The last lines show such another interpreter:
the system's Python, which (when this notebook runs in a virtual environment) has another `sys.prefix` and none
of the packages installed here. `sys.executable` never depends on `PATH`.
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
import os

def test():
    ok, out, err = run_isolated("print(6 * 7)")
    expect(ok is True, f"run_isolated returned {ok!r} for code that succeeds: did you compare returncode with 0?")
    expect(out is not None, "stdout came back as None: pass capture_output=True to subprocess.run")
    expect(not isinstance(out, bytes), f"stdout came back as bytes ({out!r}): pass text=True to get str")
    expect(not (out == "" and err == "42\\n"), "stdout and stderr came back the wrong way round: "
           "return stdout second and stderr third")
    expect(out != "", "stdout came back empty for print(6 * 7): return the child's stdout second")
    ok, out, err = run_isolated("print('it' + \\"'s\\", \\"$HOME\\")")
    # Compared stripped: a .strip() is a mistake of its own, named by the check below, not a shell's mangling.
    expect(ok is True and out.strip() == "it's $HOME", f"code with quotes and a $ in it gave {(ok, out, err)!r}: "
           "a shell command string (shell=True) mangles them; pass the list [sys.executable, '-c', code]")
    ok, out, _ = run_isolated("import os; print(os.getpid())")
    expect(out.strip() != str(os.getpid()), "the code ran in this very process: run it in a child process (subprocess.run), not with exec")
    ok, _, _ = run_isolated("import builtins; builtins.print = None")
    expect(print is not None and ok, "the child's changes should stay in the child: use a new process, not exec")
    ok, out, err = run_isolated("import sys; print('  spaced  '); sys.stderr.write('  note  \\\\n')")
    expect(out == "  spaced  \\n" or out.strip() != "spaced", "stdout came back as "
           f"{out!r} for a child that printed '  spaced  ': return result.stdout as it is, without .strip()")
    expect(out != "  note  \\n", "stdout and stderr came back the wrong way round: "
           "return stdout second and stderr third")
    expect(err == "  note  \\n" or err.strip() != "note", "stderr came back as "
           f"{err!r} for a child that wrote '  note  ': return result.stderr as it is, without .strip()")
    expect(out == "  spaced  \\n", f"stdout should be '  spaced  \\\\n' but was {out!r}: return the child's stdout second")
    expect(err == "  note  \\n", f"stderr should be '  note  \\\\n' but was {err!r}: return the child's stderr third")
    expect(ok is True, "a child that exits with 0 but writes to stderr came back as failed: success is "
           "returncode == 0, not an empty stderr (a warning on stderr is no failure)")
    for status in (1, 2, 3, 4, 5):
        ok, out, err = run_isolated(f"import os; os._exit({status})")
        expect(ok is False, f"a child that exits with status {status} and writes nothing to stderr came back as "
               "success: only returncode 0 is success, whatever stderr holds")
    ok, out, err = run_isolated("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    expect(ok is False, "a child killed by a signal (returncode -9) came back as success: a negative returncode "
           "is a failure too; compare returncode with 0")
    ok, out, err = run_isolated("raise SystemExit('bye')")
    expect(ok is False, "run_isolated said a child that exits with status 1 succeeded: only returncode 0 is success")
    expect("bye" in err, "the child's error message should be in stderr: capture it and return it third")
    return "runs code in a new process and reports success from the return code alone"
check("run_isolated", test)
""")

md("""
## 4. Exercise: predict, then check

Read each snippet below and predict, **without running it**, what your `run_isolated` returns for it: whether it
succeeded, and exactly what it printed on stdout. Fill in `predict()`; the check runs the snippets and tells you
which predictions were wrong.
""")

exercise("predict", """
SNIPPETS = {
    "a": "print('one'); print('two')",
    "b": "print('start'); 1 / 0",
    "c": "import sys; sys.stderr.write('careful\\\\n')",
    "d": "import sys; print('bye'); sys.exit(0)",
    "e": "import sys; sys.exit('stopped')",
}

def predict():
    \"\"\"For each snippet: (succeeded, stdout) as run_isolated would return them.\"\"\"
    ### BEGIN SOLUTION
    return {
        "a": (True, "one\\ntwo\\n"),
        "b": (False, "start\\n"),  # what was printed before the error is still there
        "c": (True, ""),  # stderr is not stdout, and writing to it is no failure
        "d": (True, "bye\\n"),  # sys.exit(0) is a clean exit
        "e": (False, ""),  # a message given to sys.exit goes to stderr, with status 1
    }
    ### END SOLUTION
""")

check("predict", """
import subprocess, sys

def test():
    guesses = predict()
    expect(isinstance(guesses, dict) and set(guesses) == set(SNIPPETS), "predict() should return a dict with one entry per snippet: a to e")
    for key, code in SNIPPETS.items():
        guess = guesses[key]
        expect(isinstance(guess, tuple) and len(guess) == 2, f"snippet {key}: predict a pair (succeeded, stdout), not {guess!r}")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if guess[0] != (child.returncode == 0):
            raise Feedback(f"snippet {key} ({code}): your guess of whether it succeeded is wrong: only exit status 0 is "
                           "success; an uncaught exception exits with 1, sys.exit(0) with 0, sys.exit('a message') with 1, "
                           "and writing to stderr changes nothing")
        if guess[1] != child.stdout:
            if len(guess[1]) < len(child.stdout):
                why = "output printed before a failure stays in stdout (before an exit too), and print ends each line with '\\\\n'"
            else:
                why = "stderr is separate: what goes to sys.stderr, a traceback and a message given to sys.exit are not in stdout"
            raise Feedback(f"snippet {key} ({code}): your stdout is not what the child prints there: {why}")
    return "you can read a child's result before running it"
check("predict", test)
""")

md("""
## Common mistakes

* **Testing `if result.returncode:` the wrong way round.** `0` is success and is falsy; compare with `== 0`.
* **Forgetting `capture_output=True`.** Then `stdout` is `None` and the child's output goes straight to the screen.
* **Forgetting `text=True`.** You get `bytes` (`b'42\\n'`), which never equals a `str`.
* **Judging success by stderr** (`r.stderr == ""`). A warning on stderr is no failure, and `os._exit(3)` fails
  without a word; only `returncode == 0` is success (a signal gives a negative `returncode`, a failure too).
* **Tidying the output with `.strip()`.** Return what the child printed, spaces and newlines included.
* **Building a shell command string** (`shell=True`, `f"python -c '{code}'"`): quotes in the code break it, and
  the shell becomes a second interpreter of untrusted text. Pass a list of arguments.

## Try this next

* Pass `input="..."` to `subprocess.run` and read it in the child with `input()`.
* Run `import os; print(os.getpid(), os.getppid())` in a child and compare with `os.getpid()` here.

## Key points

* `exec` and `eval` run code inside your own process: it can change anything there, even `print`.
* `subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)` runs it in a new process.
* `returncode == 0` is success; anything else is a failure; `stdout` and `stderr` hold what the child printed.
* Pass a list of arguments, never a shell string; use `sys.executable`, never whatever `"python3"` finds.

## The real thing

`cellbox.sandbox.run(argv, ...)` does this job for cellbox: it starts the child, streams and caps its output,
and returns an `Outcome` whose `status` is `ok` only for a clean exit. The next lessons add what it adds on top.
""")

answers("""
## Answers to "Try this next"

* `subprocess.run([sys.executable, "-c", "print(input().upper())"], input="hello\\n", capture_output=True,
  text=True).stdout` is `'HELLO\\n'`: `input=` is written to the child's stdin, then stdin is closed.
* The child's pid differs from `os.getpid()` here, and its parent pid (`os.getppid()` in the child) **is**
  `os.getpid()` here: the notebook's cell process started it.
""")
