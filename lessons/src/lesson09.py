lesson(9, "keep-the-machine-responsive", "Keep the machine responsive")

md("""
# Lesson 9: keep the machine responsive

**Goal:** run students' code at the lowest CPU and disk priority, so that the machine stays usable for everyone
else while it runs.

**The plan.** Limits (lessons 5 and 6) say *how much* a child may use; priority says *who goes first* when the
machine is busy. We read a process's CPU priority (its **niceness**), start children with `nice -n 19` and
`ionice -c 3`, watch a low-priority spinner lose the CPU to a normal one, and see that children inherit both
settings. Then why this is courtesy and not security.
""")

md("""
## 1. Niceness

Every process has a niceness from -20 (greedy) to 19 (nicest). When two processes want the same CPU, the
scheduler gives the nicer one a much smaller share. `os.nice(0)` reads the current value; the `nice` program
starts a command with a higher one. Raising your niceness needs no privilege; lowering it does.
""")

code("""
import os, shutil, subprocess, sys

print("this notebook's niceness:", os.nice(0))
ask = [sys.executable, "-c", "import os; print(os.nice(0))"]
print("a child's niceness:              ", subprocess.run(ask, capture_output=True, text=True).stdout.strip())
print("with nice -n 19:                 ", subprocess.run(["nice", "-n", "19", *ask], capture_output=True, text=True).stdout.strip())
""")

md("""
Under the cellbox kernel you probably see 19 everywhere: the kernel already runs every cell at the lowest
priority, and children inherit it.

## 2. Watch it work: two spinners on one CPU

We pin two spinning children to the same CPU (`taskset`-style, with `os.sched_setaffinity` in a tiny launcher)
for one second, one at our niceness and one at 19, and ask each how much CPU it got.
""")

code("""
import time

spin = ("import os, time\\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\\n"
        "end = time.monotonic() + 1\\n"
        "while time.monotonic() < end: pass\\n"
        "print(round(time.process_time(), 2), os.nice(0))")
normal = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
nicest = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
for name, proc in (("normal", normal), ("nice 19", nicest)):
    cpu, niceness = proc.communicate()[0].split()
    print(f"{name:>8} (niceness {niceness:>2}): {cpu} s of CPU in 1 s")
del normal, nicest, proc   # both have ended; later cells do not need them
""")

md("""
When both run at the same niceness (as they do inside a cellbox cell, where everything is already at 19), they
share the CPU about equally: about half a second each on an idle machine, much less on a busy one, where every
process of a lower niceness goes first. Otherwise the normal one gets nearly all of it: the nice one only runs when
nobody else wants the CPU.

## 3. Disk priority: `ionice -c 3`

A child that reads or writes a lot can make the disk slow for everyone. `ionice -c 3` puts a process in the
**idle** I/O class: it gets disk time only when no one else needs it. `ionice` with no command shows the current
class.
""")

code("""
if shutil.which("ionice"):
    print("a child's I/O class:     ", subprocess.run(["ionice"], capture_output=True, text=True).stdout.strip())
    print("with ionice -c 3:        ", subprocess.run(["ionice", "-c", "3", "ionice"], capture_output=True, text=True).stdout.strip())
    print("a grandchild of that:    ", subprocess.run(["ionice", "-c", "3", "sh", "-c", "ionice"], capture_output=True, text=True).stdout.strip())
else:
    print("ionice is not installed here (it comes with util-linux)")
""")

md("""
Under the cellbox kernel all three say `idle`: the kernel already runs every cell in the idle class, as it runs
them at niceness 19. Elsewhere the first line says `none: prio 0` (no class chosen, so the default).

Both settings are **inherited**: a child started by a nice, idle process is nice and idle too, and it cannot make
itself greedier again without privilege.

## 4. Courtesy, not security

Priority does not *limit* anything. A niced child still gets the whole machine when it is idle, can still fill the
memory, the disk and the process table, and still sees your files. Use `nice` and `ionice` **on top of** limits,
so that a busy grading run does not make the machine sluggish for the person using it.

## 5. Exercise: `courteous`

Write `courteous(argv)` returning a new command that runs `argv` at niceness 19 and, when the `ionice` program
exists (`shutil.which("ionice")`), in the idle I/O class.
""")

exercise("courteous", """
import shutil

def courteous(argv):
    \"\"\"Return a command (list of str) that runs `argv` with nice -n 19 and, when available, ionice -c 3.\"\"\"
    ### BEGIN SOLUTION
    command = ["nice", "-n", "19"]
    if shutil.which("ionice"):
        command += ["ionice", "-c", "3"]
    return command + list(argv)
    ### END SOLUTION
""")

check("courteous", """
import os, re, tempfile

def adjustment(command):
    \"\"\"(what nice adds, the word after nice) in command, or None without nice (nice(1): -n N, -nN, --adjustment=N, -N).\"\"\"
    for at, word in enumerate(command):
        if os.path.basename(word) == "nice":
            rest = [*command[at + 1:], ""]
            first = rest[0]
            value = (rest[1] if first in ("-n", "--adjustment") else first.split("=", 1)[1] if first.startswith("--adjustment=")
                     else first[2:] if first.startswith("-n") else first[1:] if re.fullmatch(r"-[0-9]+", first) else "10")
            return (int(value) if re.fullmatch(r"[-+]?[0-9]+", value) else None), first
    return None

def io_class(command):
    \"\"\"The class ionice is given in command ('3', 'idle', ...), '' without -c, or None without ionice (ionice(1)).\"\"\"
    for at, word in enumerate(command):
        if os.path.basename(word) == "ionice":
            rest = [*command[at + 1:], ""]
            for first, second in zip(rest, rest[1:]):
                if first in ("-c", "--class"):
                    return second
                if first.startswith("--class="):
                    return first.split("=", 1)[1]
                if first.startswith("-c") and len(first) > 2:
                    return first[2:]
            return ""
    return None

def test():
    mine = os.nice(0)
    command = courteous(["echo", "hi"])
    expect(os.nice(0) == mine, "courteous changed this notebook's own niceness: put nice -n 19 in the command instead of calling os.nice")
    expect(isinstance(command, list) and all(isinstance(word, str) for word in command) and command[-2:] == ["echo", "hi"],
           f"courteous should return a list of str ending with argv, got {command!r}")
    # This notebook may already run at niceness 19 (a cellbox cell does), so what the command says counts as much as
    # what the child reports.
    nice = adjustment(command[:-2])
    expect(nice is not None, "the command runs argv at the niceness it inherits (expected 19, whatever this notebook runs at): put nice -n 19 in front")
    added, word = nice
    expect(not re.fullmatch(r"[+]?[0-9]+", word), f"nice {word} runs a program called {word!r}: without -n, nice takes "
           f"{word} for the command's name; write nice -n 19")
    expect(added is not None and added >= 0, f"nice adds {added}, which asks for a higher priority (a negative niceness is "
           "greedier, and needs privilege): the lowest priority is +19, nice -n 19")
    expect(added >= 19, f"nice adds {added}, so the child does not reach niceness 19 as expected: write nice -n 19")
    niceness = subprocess.run(courteous([sys.executable, "-c", "import os; print(os.nice(0))"]), capture_output=True, text=True, timeout=10)
    expect(niceness.stdout.strip() == "19", f"the child's niceness was {niceness.stdout.strip() or niceness.stderr.strip()!r}, "
           "expected 19: write nice -n 19 (without -n, nice takes 19 for the command's name)")
    if shutil.which("ionice"):
        chosen = io_class(command[:-2])
        expect(chosen is not None, "ionice is installed here but the command has none: add ionice -c 3")
        expect(chosen in ("3", "idle"), f"ionice {'-c ' + chosen if chosen else 'without -c'} is not the idle class: "
               "write ionice -c 3 (-n only sets a level inside a class)")
        io = subprocess.run(courteous(["ionice"]), capture_output=True, text=True, timeout=10).stdout.strip()
        expect(io == "idle", f"the child's I/O class was {io!r}: add ionice -c 3")
    path, empty = os.environ.get("PATH", ""), tempfile.mkdtemp()
    os.environ["PATH"] = empty   # a machine without ionice (nor anything else on PATH)
    try:
        bare = courteous(["echo", "hi"])
    finally:
        os.environ["PATH"] = path
        os.rmdir(empty)
    expect("ionice" not in " ".join(map(str, bare)), f"with no ionice on PATH courteous still gave {bare!r}: counting on "
           "ionice everywhere; add it only when shutil.which('ionice') finds it, at each call")
    return "the child runs at the lowest CPU and I/O priority"
check("courteous", test)
""")

md("""
## 6. Exercise: predict the niceness

A process at niceness 0 runs each command below, ending with a program that prints its own niceness. Predict,
**without running them**, the number printed. (`nice` without `-n` adds 10; niceness never goes above 19.)
""")

exercise("predict_niceness", """
CASES = {
    "a": "nice -n 5 nice -n 5 PRINT",
    "b": "nice -n 19 nice -n 5 PRINT",
    "c": "nice -n 10 sh -c 'nice -n 3 PRINT'",
    "d": "nice PRINT",
}

def predict_niceness():
    \"\"\"For each case: the niceness PRINT reports, starting from niceness 0.\"\"\"
    ### BEGIN SOLUTION
    return {"a": 10, "b": 19, "c": 13, "d": 10}
    ### END SOLUTION
""")

check("predict_niceness", f"""
ANSWERS = {hashed('predict_niceness', {"a": 10, "b": 19, "c": 13, "d": 10})}
WHY = {{"a": "each nice adds to the niceness it inherited",
       "b": "niceness stops at 19, it never goes above",
       "c": "the shell inherits its niceness, and its child adds its own -n",
       "d": "how much does nice add without -n?"}}

def test():
    guesses = predict_niceness()
    expect(isinstance(guesses, dict) and set(guesses) == set(CASES), "predict_niceness() should return a dict with one entry per case: a to d")
    expect(all(type(value) is int for value in guesses.values()), "each prediction is the number printed, an int (10, not '10')")
    for key in wrong_keys("predict_niceness", guesses, ANSWERS):
        raise Feedback(f"case {{key}}: {{guesses[key]!r}} is not what it prints: {{WHY[key]}}")
    return "priorities add up, are inherited, and stop at 19"
check("predict_niceness", test)
""")

md("""
## Common mistakes

* **`nice 19 cmd`.** Without `-n`, `19` is taken as the command name. Write `nice -n 19 cmd`.
* **`os.nice(19)` in the notebook.** That makes *you* nice, for good: you cannot lower it again without privilege.
* **Counting on `ionice` everywhere.** Some systems lack it, and some I/O schedulers ignore the classes; check and
  report instead of failing (the check runs your `courteous` with no `ionice` on `PATH`).
* **`nice -n -19`.** A negative niceness is *greedier*, not nicer (and needs privilege); the nicest is `+19`.
* **Trusting what the child reports.** Under the cellbox kernel everything already runs at 19 and idle, so a command
  without `nice` or `ionice` looks right there; the check also reads the command itself.

## Try this next

* `os.setpriority(os.PRIO_PROCESS, pid, 19)` sets another process's niceness; try it on a child you started.
* Run the two spinners without pinning them: with two CPUs, does niceness still matter?

## Key points

* `nice -n 19` gives a process the lowest CPU priority; `ionice -c 3` puts it in the idle I/O class.
* Both are inherited by children, and a process cannot make itself greedier again without privilege.
* Priority decides who goes first, not how much: it is courtesy on top of limits, not security.

## The real thing

`cellbox.sandbox.limits.Limits` has `nice` (default 19) and `io_class` (default `idle`); `cellbox.sandbox._launch` applies them with
setpriority(2) and ioprio_set(2) before exec, and reports in the `Outcome`'s notes when it could not.
""")

answers("""
## Answers to "Try this next"

* `os.setpriority(os.PRIO_PROCESS, proc.pid, 19)` on a child you own works without privilege (raising its
  niceness); `os.getpriority(os.PRIO_PROCESS, proc.pid)` then says 19. Setting it back lower raises
  `PermissionError` unless you have `CAP_SYS_NICE`.
* Hardly, on an otherwise idle two-CPU machine: each spinner gets a CPU of its own and both get about 1 s of CPU.
  Niceness only matters when processes compete for the same CPU (on a busy machine, or under a cellbox cell where
  both already run at 19, they share equally).
""")
