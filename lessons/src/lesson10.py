lesson(10, "a-fresh-virtualenv-per-task", "A fresh virtualenv per task")

md("""
# Lesson 10: a fresh virtualenv per task

**Goal:** give every task (one student's submission, one run) its own clean set of installed packages in a
directory that is deleted afterwards, and install into it as carefully as you run the tests.

**The plan.** We create a virtual environment with the standard library's `venv` module and check that it sees
none of the packages of our own environment. Then we look at what *installing* a project really does: pip runs the
project's **build backend**, which is the project's own code. We watch a "package" write a file into the home
directory while being installed, and conclude that the install needs the same sandbox as the tests.

```mermaid
flowchart LR
    T["task directory<br/>(home/, tmp/, venv/)"] --> V["fresh venv"]
    V --> I["pip install the submission<br/>(runs its build backend: untrusted)"]
    I --> R["run the tests"]
    R --> D["delete the task directory"]
    I -. "same limits, same scrubbed environment" .- R
```
""")

md("""
## 1. Why not one shared environment?

If every submission is installed into the same environment, the first one can leave things for the next:
a package that shadows `pytest`, a `.pth` file that runs code at every start-up, a changed dependency version.
Grading would depend on the order of submissions. A fresh environment per task makes each run start from the same
clean state, and deleting the task directory removes everything the run installed.

## 2. Creating one

`venv.create(path, with_pip=False)` makes a small directory with a `bin/python` that points at our interpreter,
and its own empty `site-packages`. Without pip it takes a fraction of a second.
""")

code("""
import os, subprocess, sys, tempfile, time, venv

task = tempfile.mkdtemp(prefix="lesson10-")
started = time.monotonic()
venv.create(os.path.join(task, "venv"), with_pip=False, symlinks=True)
print(f"created in {time.monotonic() - started:.2f} s:", sorted(os.listdir(os.path.join(task, "venv"))))

venv_python = os.path.join(task, "venv", "bin", "python")
ask = "import sys, importlib.util; print(sys.prefix); print('nbformat importable:', importlib.util.find_spec('nbformat') is not None)"
print(subprocess.run([venv_python, "-c", ask], capture_output=True, text=True).stdout)
print("and here, in the notebook's environment: ", subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True).stdout.split("\\n")[1])
""")

md("""
The venv's `sys.prefix` is the new directory, and the packages of our environment (here `nbformat`) are not
visible in it. Whatever a task installs there stays there.

## 3. Installing runs the project's code

A Python project says in `pyproject.toml` which **build backend** builds it. When pip installs the project, it
imports that backend and calls it. The backend can be *in the project itself* (`backend-path`). So installing a
submission means running the submission's code, before a single test has run.

Here is a small project whose backend writes a file into the home directory when it is imported, then fails.
""")

code("""
project = os.path.join(task, "friendly")
os.makedirs(project)
with open(os.path.join(project, "pyproject.toml"), "w") as pyproject:
    pyproject.write('[build-system]\\nrequires = []\\nbuild-backend = "backend"\\nbackend-path = ["."]\\n'
            '[project]\\nname = "friendly"\\nversion = "1.0"\\n')
with open(os.path.join(project, "backend.py"), "w") as backend:
    backend.write("import os\\n"
            "with open(os.path.expanduser('~/i-was-here.txt'), 'w') as note:\\n"
            "    note.write('the build backend ran and saw the environment variables ' + ' '.join(sorted(os.environ)))\\n"
            "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\\n"
            "    raise RuntimeError('this project builds nothing: it only wanted to run')\\n")
del pyproject, backend   # both files are closed; later cells do not need them
print(sorted(os.listdir(project)))
""")

md("""
We install it with pip, but **as we would run a test**: a scrubbed environment whose `HOME` is inside the task
directory (lesson 4), a time limit (lesson 3). pip fails, of course; what matters is what ran before.
""")

code("""
home = os.path.join(task, "home")
os.makedirs(home)
env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "HOME": home, "TMPDIR": home}
result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                         "--target", os.path.join(task, "site"), project],
                        capture_output=True, text=True, env=env, timeout=60)
print("pip returncode:", result.returncode)
print("the home directory now holds:", os.listdir(home))
print(open(os.path.join(home, "i-was-here.txt")).read())
""")

md("""
The backend ran, with our user's rights. It saw only the three variables we allowed (`PATH`, `HOME`, `TMPDIR`) and
those Python and pip add for a build (`LC_CTYPE`, `PEP517_BACKEND_PATH`, `PEP517_BUILD_BACKEND`,
`PIP_BUILD_TRACKER`, `PYTHONNOUSERSITE`, `PYTHONPATH`), none of ours, and wrote into a home directory we are about
to delete. Without the scrubbing it would have written into *your* home and seen *your* tokens; without
limits it could have spun, slept or allocated forever. **The install is part of the untrusted run.**
""")

code("""
import shutil
shutil.rmtree(task)
print("task directory removed:", not os.path.exists(task))
""")

md("""
## 4. Exercise: `fresh_venv`

Write `fresh_venv(path)` that creates a new virtual environment at `path` (without pip, so it is quick) and
returns the path of its Python interpreter (`path/bin/python`) as a string.
""")

exercise("fresh_venv", """
import os, venv

def fresh_venv(path):
    \"\"\"Create a virtual environment at `path` (no pip) and return the path of its python (str).\"\"\"
    ### BEGIN SOLUTION
    venv.create(path, with_pip=False, symlinks=True)
    return os.path.join(str(path), "bin", "python")
    ### END SOLUTION
""")

check("fresh_venv", """
def test():
    where = os.path.join(tempfile.mkdtemp(prefix="lesson10-check-"), "env")
    try:
        with deadline(12, "fresh_venv took more than 12 s for one venv: is pip going in (ensurepip)? make it without "
                      "pip (with_pip=False, or --without-pip), which takes a fraction of a second"):
            python = fresh_venv(where)
        expect(isinstance(python, str) and os.path.exists(python), f"fresh_venv returned {python!r}, which does not exist")
        said = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=30).stdout.split("\\n")
        expect(os.path.realpath(said[0]) == os.path.realpath(where), f"that python's sys.prefix is {said[0]!r}, not the new venv")
        config = open(os.path.join(where, "pyvenv.cfg")).read().replace(" ", "").lower()
        expect(said[1].endswith("False") and "include-system-site-packages=true" not in config,
               "the new environment sees packages installed outside it: don't use system_site_packages")
        same = f"import sys; print(sys.version_info[:2] == {tuple(sys.version_info[:2])!r}, end='')"
        expect(subprocess.run([python, "-c", same], capture_output=True, text=True, timeout=30).stdout == "True",
               "the new venv runs another Python version than this notebook: make it with this notebook's own interpreter "
               "(venv.create, or sys.executable -m venv)")
        pip = subprocess.run([python, "-c", "import importlib.util; print(importlib.util.find_spec('pip') is None, end='')"],
                             capture_output=True, text=True, timeout=30).stdout
        expect(pip == "True", "the new venv has pip in it: make it without pip (with_pip=False, or --without-pip), "
               "which takes a fraction of a second instead of several")
        with deadline(12, "fresh_venv took more than 12 s for a second venv: make it without pip"):
            other = fresh_venv(where + "-second")
        expect(other != python and os.path.exists(other), f"a second task got {other!r}: every task needs its own fresh venv at its own path")
    finally:
        shutil.rmtree(os.path.dirname(where), ignore_errors=True)
    return "a clean environment in a directory you can throw away"
check("fresh_venv", test)
""")

md("""
## 5. Exercise: which steps run the submission's code?

Here are steps a grader might take with a student's project folder (it has a `pyproject.toml` whose build backend
lives in the project, as in section 3). Which of them run code **from the project**? Return their keys as a set
from `runs_project_code()`.
""")

exercise("runs_project_code", """
STEPS = {
    "a": "venv.create(task / 'venv', with_pip=False)",
    "b": "shutil.copytree(project, task / 'work')",
    "c": "tomllib.load(open(project / 'pyproject.toml', 'rb'))",
    "d": "pip install ./project",
    "e": "python -m build ./project",
    "f": "python -m pytest tests/ (the tests import the project)",
}

def runs_project_code():
    \"\"\"The keys of STEPS that run code written by the project's author.\"\"\"
    ### BEGIN SOLUTION
    # Installing or building calls the project's build backend; running its tests imports it.
    # Creating a venv, copying files and parsing TOML only read data.
    return {"d", "e", "f"}
    ### END SOLUTION
""")

check("runs_project_code", f"""
ANSWERS = {hashed("runs_project_code", {key: key in {"d", "e", "f"} for key in "abcdef"})}
WHY = {sealed("runs_project_code", {
    ("a", True): "creating a venv copies and links our interpreter's files, nothing of the project",
    ("b", True): "copying files reads them, it never runs them",
    ("c", True): "parsing TOML reads data, it never runs it",
    ("d", False): "pip install calls the project's build backend, which is the project's code: it belongs in the sandbox",
    ("e", False): "building calls the project's build backend too",
    ("f", False): "the tests import the project, which runs its code",
})}

def test():
    guess = runs_project_code()
    expect(isinstance(guess, set), f"runs_project_code() should return a set of keys, not {{type(guess).__name__}}")
    unknown = sorted(map(repr, guess - set(STEPS)))
    expect(not unknown, f"{{', '.join(unknown)}} are not keys of STEPS: answer with the letters a to f")
    for key in wrong_keys("runs_project_code", {{key: key in guess for key in STEPS}}, ANSWERS):
        truth = "does not run" if key in guess else "runs"
        raise Feedback(f"{{key}} ({{STEPS[key]}}) {{truth}} the project's code after all: "
                       f"{{unseal('runs_project_code', key, key in guess, WHY, '')}}")
    return "the install is part of the untrusted run"
check("runs_project_code", test)
""")

md("""
## 6. Exercise: one task, one venv, then none

Write `run_in_fresh_venv(code)`: make a new task directory with `tempfile.mkdtemp()`, a fresh venv inside it (your
`fresh_venv`), run `code` with that venv's Python, and return what it printed on stdout, as it was printed. Delete
the whole task directory before returning, also when something goes wrong on the way (a `finally`).
""")

exercise("run_in_fresh_venv", """
import os, shutil, subprocess, tempfile

def run_in_fresh_venv(code):
    \"\"\"stdout (str) of `code` run by the Python of a venv made for this call alone, deleted before returning.\"\"\"
    ### BEGIN SOLUTION
    task = tempfile.mkdtemp(prefix="task-")
    try:
        python = fresh_venv(os.path.join(task, "venv"))
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout
    finally:
        shutil.rmtree(task, ignore_errors=True)
    ### END SOLUTION
""")

check("run_in_fresh_venv", """
def left_in(folder):
    return sorted(os.listdir(folder))

def test():
    prefix = "import sys; print(sys.prefix)"
    scratch = tempfile.mkdtemp(prefix="lesson10-check-")
    saved, tempfile.tempdir = tempfile.tempdir, scratch   # where tempfile.mkdtemp() makes the task directories now
    try:
        first = run_in_fresh_venv(prefix)
        expect(isinstance(first, str), f"run_in_fresh_venv returned a {type(first).__name__}: return what the code printed "
               "on stdout, as a str (text=True)")
        first, second = first.strip(), run_in_fresh_venv(prefix).strip()
        expect(first and first != sys.prefix, f"the code ran with sys.prefix {first!r}, not in a new venv: use fresh_venv's python")
        expect(first != second, f"two runs shared the venv {first}: reusing one venv lets one submission change it "
               "for all the others; make a fresh one per call")
        expect(not os.path.exists(first), f"{first} still exists after the run: forgetting to delete the venv, "
               "a few hundred tasks a day fill a disk; remove the task directory")
        expect(not left_in(scratch), f"the runs left {left_in(scratch)} in the temporary folder: remove the whole task "
               "directory, not only the venv inside it")
        mixed = run_in_fresh_venv("import sys; print('out'); print('err', file=sys.stderr)")
        expect(mixed == "out\\n", f"for code printing 'out' on stdout and 'err' on stderr it returned {mixed!r}: "
               "return stdout alone, as it was printed")
        failed = run_in_fresh_venv(prefix + "; raise SystemExit(3)").strip()
        expect(failed and not os.path.exists(failed), f"{failed or 'the venv'} was left behind by code that failed: "
               "delete the task directory in a finally")
        marker = os.path.join(scratch, "prefix.txt")
        try:   # output that is not UTF-8: with text=True, run_in_fresh_venv itself raises UnicodeDecodeError
            run_in_fresh_venv(f"import os, sys; open({marker!r}, 'w').write(sys.prefix); os.write(1, bytes([255]))")
        except Exception:
            pass
        raised = open(marker).read() if os.path.exists(marker) else ""
        expect(raised and not os.path.exists(raised), f"{raised or 'the venv'} was left behind when run_in_fresh_venv "
               "itself raised (the code printed bytes that are not UTF-8): delete the task directory in a finally")
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(scratch, ignore_errors=True)
    return "each task gets its own venv, and leaves nothing behind"
check("run_in_fresh_venv", test)
""")

md("""
## Common mistakes

* **Reusing one venv "to save time".** The first submission can change it for all the others. Make it fresh, or
  copy a clean template made once and never handed to a submission (the third exercise).
* **`system_site_packages=True`.** Convenient, but the task then sees (and its imports can be shadowed by) what is
  installed in your environment.
* **Installing outside the sandbox "because pip is trusted".** pip is; the project's `setup.py` or build backend is
  not (the second exercise).
* **Forgetting to delete it.** A few hundred tasks a day fill a disk (the third exercise). Deleting only the venv
  leaves the task directory behind; deleting it after the run but outside a `finally` leaves it all behind when the
  run raises.

## Try this next

* Time `venv.create(..., with_pip=True)`: where does the difference come from?
* Put a `.pth` file containing `import os; print("hello")` into a venv's `site-packages` and start its Python.

## Key points

* A fresh virtualenv per task gives every run the same clean set of packages, and a directory to delete after.
* `venv.create(path, with_pip=False)` takes a fraction of a second; do not share one venv between submissions.
* Installing a project runs its build backend, which is the project's code: install inside the sandbox, with the
  same limits and scrubbed environment as the tests.

## The real thing

`cellbox.grading` (`cellbox grade`) gives every submission its own task directory and virtualenv, built quickly from
cached pieces that no submission can change, installs the submission there under the same limits and scrubbed
environment as its tests, and deletes it all afterwards.
""")

answers("""
## Answers to "Try this next"

* Seconds instead of a fraction of one: `with_pip=True` runs `ensurepip`, which installs pip from the wheel bundled
  with Python into the new environment (unpacking and byte-compiling thousands of files).
* `hello` is printed before anything else, at every start of that Python: `site` executes lines of `.pth` files
  that begin with `import`. That is why a shared venv is dangerous: one submission can plant code that runs in
  every later one.
""")
