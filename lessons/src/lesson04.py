lesson(4, "scrub-the-environment", "Scrub the environment")

md("""
# Lesson 4: scrub the environment

**Goal:** give a child only the environment variables it needs, so that no secret of ours leaks into it.

**The plan.** We put a fake secret token in our own environment and watch a child read it, because children
inherit their parent's environment by default. We try the tempting fix, a denylist of "secret-looking" names, and
watch it miss one. Then we build the environment from an **allowlist**, starting from nothing, with `HOME` pointing
at a throwaway directory.
""")

md("""
## 1. The leak

Every process has an environment: a dictionary of strings (`os.environ`). A child started without `env=` gets a
**copy of all of it**. Tokens and passwords very often live there (cloud credentials, CI secrets, the key of a
Jupyter kernel's connection).
""")

code("""
import os, subprocess, sys

def plant_secrets():
    \"\"\"Put two fake secrets in our own environment, as a CI job or a cloud shell would.\"\"\"
    os.environ["GITHUB_TOKEN"] = "ghp_pretend_this_is_real"
    os.environ["SERVICE_CREDENTIALS"] = "hunter2"

plant_secrets()

spy = "import os; print({k: v for k, v in os.environ.items() if 'TOKEN' in k or 'CRED' in k})"
leaked = subprocess.run([sys.executable, "-c", spy], capture_output=True, text=True)
print("the child sees:", leaked.stdout)
""")

md("""
## 2. The tempting fix: a denylist

Copy the environment, but drop names that *look* secret. It catches the token... and misses the credential,
because nobody thought of that name. There is always a name you did not think of.
""")

code("""
def denylist_env():
    return {k: v for k, v in os.environ.items() if not any(w in k for w in ("TOKEN", "SECRET", "PASSWORD", "KEY"))}

plant_secrets()   # again: under the cellbox kernel every cell is a new process with a fresh environment
leaked = subprocess.run([sys.executable, "-c", spy], capture_output=True, text=True, env=denylist_env())
print("with a denylist the child sees:", leaked.stdout)
""")

md("""
## 3. The fix: an allowlist

Start from an **empty** dictionary and add only names you chose on purpose:

* `PATH`, so the child can find programs: the directory of our interpreter first, then the system directories;
* `HOME` and `TMPDIR`, pointing into a **throwaway directory**, so caches and configuration files the child writes
  (`~/.cache`, `~/.config`, matplotlib's cache...) land there and are deleted afterwards, not in your real home;
* `LANG`, when set, so text is printed in the right encoding;
* whatever the task really needs, added explicitly by the caller.

```mermaid
flowchart LR
    P["parent environment<br/>PATH, HOME, GITHUB_TOKEN, ..."] -. "nothing copied by default" .-> C
    A["allowlist: PATH, LANG"] --> C["child environment"]
    T["task directory: HOME, TMPDIR"] --> C
```
""")

code("""
import tempfile

task = tempfile.mkdtemp(prefix="lesson04-")
clean = {
    "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
    "HOME": task,
    "TMPDIR": task,
}
if "LANG" in os.environ:
    clean["LANG"] = os.environ["LANG"]

seen = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.environ))"], capture_output=True, text=True, env=clean)
print("the child's whole environment:", seen.stdout)
where = subprocess.run([sys.executable, "-c", "import os; print(os.path.expanduser('~'))"], capture_output=True, text=True, env=clean)
print("the child's home:", where.stdout.strip())
""")

md("""
(Python itself may add a name or two at start-up, such as `LC_CTYPE`; that is not a leak, it was never ours.)
Remove the throwaway directory when the run is over:
""")

code("""
import shutil
shutil.rmtree(task)
print("removed", task, "->", os.path.exists(task))
""")

md("""
## 4. Exercise: `allowlist_env`

Write `allowlist_env(home, extra=None)` returning a **new** dictionary with exactly: `PATH` (our interpreter's
directory first, then `/usr/bin` and `/bin`), `HOME` and `TMPDIR` set to `home`, `LANG` copied from `os.environ`
only when it is set there, and then every name in `extra` (a dict, possibly `None`).
""")

exercise("allowlist_env", """
import os, sys

def allowlist_env(home, extra=None):
    \"\"\"Return a child's environment built from nothing but an allowlist (a new dict of str to str).\"\"\"
    ### BEGIN SOLUTION
    env = {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TMPDIR": str(home),
    }
    if "LANG" in os.environ:
        env["LANG"] = os.environ["LANG"]
    env.update(extra or {})
    return env
    ### END SOLUTION
""")

check("allowlist_env", """
import contextlib, os, subprocess, sys, tempfile
from pathlib import Path

@contextlib.contextmanager
def environment(**changes):
    \"\"\"This notebook's environment with `changes` (None: unset) while the block runs, as it was afterwards.\"\"\"
    saved = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

def test():
    home = tempfile.mkdtemp(prefix="lesson04-check-")
    try:
        return probe(home)
    finally:
        os.rmdir(home)

def probe(home):
    path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    # Our PATH is changed meanwhile: a PATH copied from the notebook, or found from it, shows.
    with environment(SERVICE_CREDENTIALS="hunter2", LANG="C.UTF-8", PATH="/opt/nowhere/bin:/usr/bin:/bin"):
        before = dict(os.environ)
        try:
            env = allowlist_env(home)
        except TypeError as error:
            raise Feedback(f"allowlist_env(home) raised TypeError ({error}): extra may be None, so add "
                           "`extra or {}`") from None
        after = dict(os.environ)
    lang = env.get("LANG") if isinstance(env, dict) else None
    expect(isinstance(env, dict), f"allowlist_env should return a dict, not {type(env).__name__}")
    expect(env is not os.environ, "return a new dict, not os.environ itself")
    expect(after == before, "allowlist_env changed this notebook's own environment (os.environ): build a new dict "
           "and leave os.environ alone; the scrubbing is for the child, not for us")
    expect("SERVICE_CREDENTIALS" not in env, "SERVICE_CREDENTIALS leaked: start from an empty dict, not a copy of os.environ")
    expect("PATH" in env, "there is no PATH: without it the child cannot find programs such as git or python3")
    unexpected = sorted(set(env) - {"PATH", "HOME", "TMPDIR", "LANG"})
    expect(not unexpected, f"these names are not on the allowlist: {unexpected}")
    expect(env.get("HOME") != os.path.expanduser("~") or home == os.path.expanduser("~"),
           "HOME is still your real home: point it at the throwaway directory you were given")
    expect(env.get("HOME") == home and env.get("TMPDIR") == home, "HOME and TMPDIR should both be the home you were given")
    expect(env["PATH"] != "/opt/nowhere/bin:/usr/bin:/bin", "PATH was copied from this notebook's environment: "
           "build it from the directory of sys.executable, then /usr/bin and /bin")
    expect(env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable),
           "PATH should start with the directory of sys.executable, so the child finds our Python first")
    expect(env["PATH"] == path, f"PATH was {env['PATH']!r}: expected the directory of sys.executable, /usr/bin and "
           f"/bin, joined with os.pathsep")
    extra = {"COURSE": "py101"}
    got = allowlist_env(home, extra)
    expect(extra == {"COURSE": "py101"}, "allowlist_env changed the caller's extra dict: copy into a new dict")
    expect(got.get("COURSE") == "py101", "names given in extra should be added")
    expect(allowlist_env(home, {"PATH": "/custom/bin"}).get("PATH") == "/custom/bin", "a PATH given in extra was "
           "overwritten: add the names of extra last, so that what the caller asks for wins")
    typed = allowlist_env(Path(home), {"COURSE": "py101"})
    odd = sorted(name for name, value in typed.items() if not isinstance(value, str))
    expect(not odd, f"{odd} are not strings when home is a pathlib.Path: environment values must be str, use str(home)")
    expect(typed.get("HOME") == home, "HOME should be str(home) when home is a pathlib.Path")
    with environment(SERVICE_CREDENTIALS="hunter2"):
        env = allowlist_env(home)
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('SERVICE_CREDENTIALS'))"],
                               capture_output=True, text=True, env=env)
    expect(child.stdout.strip() == "None", "a child started with this environment still saw the secret")
    expect(lang == "C.UTF-8", "with LANG set in os.environ, the child should get the same LANG: copy it")
    with environment(LANG=None):
        unset = allowlist_env(home)
    expect("LANG" not in unset, f"with LANG not set in os.environ, the child got LANG={unset.get('LANG')!r}: copy "
           "LANG only when it is set")
    return "the child gets only what you chose, and a throwaway home"
check("allowlist_env", test)
""")

md("""
## 5. Exercise: read the denylist

Read `denylist_env` from section 2 again, then predict, **without running it**, which names of the environment
below it lets through to the child. Return them as a set from `denylist_passes()`. Then look at your answer: which
of the names that pass hold a secret, and which harmless names did the denylist drop?
""")

exercise("denylist_passes", """
SAMPLE = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/ada",
    "GITHUB_TOKEN": "ghp_pretend",
    "DB_PASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "pretend",
    "DATABASE_URL": "postgres://admin:hunter2@db.example/prod",
    "NPM_AUTH": "npm_pretend",
    "KEYBOARD_LAYOUT": "us",
}

def denylist_passes():
    \"\"\"The names of SAMPLE that denylist_env (section 2) would keep, as a set.\"\"\"
    ### BEGIN SOLUTION
    # Kept unless the name contains TOKEN, SECRET, PASSWORD or KEY. DATABASE_URL and NPM_AUTH carry
    # secrets and pass; KEYBOARD_LAYOUT is harmless and is dropped, because it contains KEY.
    return {"PATH", "HOME", "DATABASE_URL", "NPM_AUTH"}
    ### END SOLUTION
""")

check("denylist_passes", f"""
# Whether each name passes, as digests: reading this cell gives no answer away.
ANSWERS = {hashed("denylist_passes", {name: name in {"PATH", "HOME", "DATABASE_URL", "NPM_AUTH"} for name in
                  ["PATH", "HOME", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL", "NPM_AUTH",
                   "KEYBOARD_LAYOUT"]})}

def test():
    guess = denylist_passes()
    expect(isinstance(guess, (set, frozenset)), f"denylist_passes() should return a set of names, not {{type(guess).__name__}}")
    unknown = sorted(str(name) for name in guess if name not in SAMPLE)
    expect(not unknown, f"{{unknown}} are not names of SAMPLE: give the names exactly as they are written there")
    kept = {{name: name in guess for name in SAMPLE}}
    wrong = wrong_keys("denylist_passes", kept, ANSWERS)
    if len(wrong) == len(SAMPLE):
        raise Feedback("every name is the wrong way round: those are the names the denylist drops, and the question "
                       "asks which it keeps")
    for name in wrong:
        if kept[name]:
            raise Feedback(f"{{name}} does not pass: `w in k` matches anywhere in the name, so look for TOKEN, SECRET, "
                           "PASSWORD and KEY inside it, harmless names included")
        raise Feedback(f"{{name}} passes too: the denylist only drops names that contain TOKEN, SECRET, PASSWORD or "
                       "KEY, and a secret can hide under any other name")
    return "two secrets pass the denylist, one harmless name does not: that is why we allowlist"
check("denylist_passes", test)
""")

code("""
# Tidy up the fake secrets of this lesson.
for name in ("GITHUB_TOKEN", "SERVICE_CREDENTIALS"):
    os.environ.pop(name, None)
""")

md("""
## Common mistakes

* **`env = os.environ.copy()` then deleting names.** That is a denylist again.
* **Forgetting `PATH`.** With no `PATH`, a command such as `"python3"` or `"git"` cannot be found at all.
* **Leaving `HOME` pointing at the real home.** A child's `pip install --user`, caches and dotfiles then land in
  your account and survive the run.
* **Passing non-strings** (`{"LIMIT": 5}`): environment values must be `str`.

## Try this next

* Run `env -i /usr/bin/env` in a child: what does a truly empty environment look like?
* Start a child with `env={}` and `[sys.executable, "-c", "print(1)"]`: does Python still start? Why?

## Key points

* A child gets a copy of its parent's whole environment unless you pass `env=`, secrets included.
* A denylist of secret-looking names always misses one; build the environment from an allowlist, starting empty.
* Give the child `PATH` (our interpreter's directory first), and `HOME`/`TMPDIR` in a throwaway directory.
* Environment values are strings.

## The real thing

`cellbox.sandbox.environment.build_environment` builds every child's environment from an allowlist, with `HOME` and
`TMPDIR` inside a `TaskDirectory` that is removed after the run; under the cellbox kernel, nothing of the kernel
(its connection file, its key, `JPY_*` variables) reaches a cell.
""")

answers("""
## Answers to "Try this next"

* Nothing at all: `env -i` starts the command with an empty environment, and `env` prints one line per name.
* Yes, it prints `1`: `sys.executable` is an absolute path, so no `PATH` is needed to find it, and Python needs
  no environment variable to start (without `LANG` it uses the C locale, with UTF-8 since Python 3.7). Only a
  command given by bare name (`"python3"`, `"git"`) needs `PATH`.
""")
