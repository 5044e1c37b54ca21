lesson(12, "beyond-rlimits", "Beyond rlimits")

md("""
# Lesson 12: beyond rlimits

**Goal:** know what our sandbox still allows, which stronger walls exist, and how to get results out of a sandbox
safely.

**The plan.** Everything so far limits *how much* a child uses. Nothing limits *what it may touch*: we watch a
limited child read files and talk over the network. Then we meet the walls that do restrict that (namespaces,
Landlock, containers, virtual machines) and try a network namespace. Last, three practical things: carrying a small
file out through stdout with base64, drawing a plot with no screen (the Agg backend), and reading exit code 137.
""")

md("""
## 1. What limits do not stop: reading files

A child runs as our user, so it can read every file our user can read. The notebook's working directory is
`lessons/`, which is next to... the solutions.
""")

code("""
import os, subprocess, sys

peek = '''
import os
print("first line of /etc/passwd:", open("/etc/passwd").readline().strip())
print("the solutions folder is readable:", os.path.isdir("solutions") and os.access("solutions", os.R_OK))
'''
print(subprocess.run([sys.executable, "-c", peek], capture_output=True, text=True, timeout=10).stdout)
""")

md("""
(That is why an instructor grades on a machine or in a container that holds no solutions and no secrets, and why
cellbox can run children as another, unprivileged user.)

## 2. What limits do not stop: the network

We open a tiny server on this machine in a thread, and a child connects to it and sends a message. It could as well
be sending your files somewhere.
""")

code("""
import socket, threading

server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
received = []
threading.Thread(target=lambda: received.append(server.accept()[0].recv(100)), daemon=True).start()

send = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'your secrets')"
result = subprocess.run([sys.executable, "-c", send], capture_output=True, text=True, timeout=10)
server.close()
print("child's returncode:", result.returncode, "| the server received:", received)
del server   # closed: later cells do not need it
""")

md("""
## 3. Walls that restrict *what*

* **Namespaces** (Linux): a process gets its own view of one kind of resource. A **network** namespace has no
  interfaces but its own loopback: no way out. A **PID** namespace sees only its own processes (and the kernel
  kills them all when its first process dies, lesson 7). A **mount** namespace can hide or make read-only parts of
  the file system. `unshare` starts a command in new namespaces; `-r` maps our user to root *inside* a new user
  namespace, so no real privilege is needed where the system allows user namespaces.
* **Landlock** (Linux 5.13 and later): a process restricts its *own* file-system access (and, in newer kernels, TCP
  ports), without privilege; the restriction is inherited and cannot be lifted.
* **Containers** combine namespaces, cgroups and seccomp filters. They **share the host's kernel**: one kernel bug
  is enough to get out.
* **Virtual machines** run their **own kernel**; the boundary is the hypervisor, much smaller than a kernel.
  (Light VMs such as Firecracker start in a fraction of a second.)

Let's try the network namespace on the same child:
""")

code("""
import shutil

if shutil.which("unshare"):
    server = socket.create_server(("127.0.0.1", 0))
    send = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)"
    result = subprocess.run(["unshare", "-r", "-n", sys.executable, "-c", send], capture_output=True, text=True, timeout=10)
    server.close()
    del server
    said = result.stderr.strip().splitlines()
    print("returncode:", result.returncode, "|", said[-1] if said else "(no message)")
else:
    print("unshare is not installed here (it comes with util-linux)")
""")

md("""
Inside the new namespace, even `127.0.0.1` is another machine's loopback, with nobody listening (or, where user
namespaces are not allowed, `unshare` itself fails and says so: report it, never skip it silently). Under the
cellbox kernel you see the second case, `unshare failed: No space left on device`: the session's sandbox
(bubblewrap's `--disable-userns`) lets no cell make a user namespace of its own, and ENOSPC is how Linux says that
the count of user namespaces is at its limit. The session already runs in namespaces of its own.

## 4. Getting results out

A sandboxed child should not write into your directories. Its output is the channel: **text on stdout**. For a
small binary file (an image, a pickle you will *not* unpickle), encode it with **base64**, which turns any bytes
into plain letters, and decode it in the parent. Large files need a shared directory you inspect afterwards.

A plot makes a good example. There is no screen in a sandbox, so matplotlib must use its **Agg** backend, which
draws into memory (`MPLBACKEND=Agg`, which cellbox sets for every child).
""")

code("""
import base64, importlib.util

draw = '''
import base64, io, sys
import matplotlib
matplotlib.use("Agg")                       # no screen: draw into memory
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([0, 1, 2, 3], [0, 1, 4, 9])
ax.set_title("drawn in a child")
buffer = io.BytesIO()
fig.savefig(buffer, format="png")
print(base64.b64encode(buffer.getvalue()).decode())
'''
if importlib.util.find_spec("matplotlib") is None:
    print("matplotlib is not installed here; pip install matplotlib to see the plot")
else:
    import tempfile
    home = tempfile.mkdtemp(prefix="lesson12-")     # matplotlib keeps a font cache in the child's home
    result = subprocess.run([sys.executable, "-c", draw], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MPLBACKEND": "Agg", "HOME": home})
    shutil.rmtree(home)
    png = base64.b64decode(result.stdout)
    print(f"{len(png)} bytes, starts with {png[:8]!r}")
    from IPython.display import Image, display
    display(Image(data=png))
""")

md("""
## 5. Exit code 137

Python reports a child killed by a signal as a negative return code (`-9`). A **shell** reports it as `128 + n`:
`137` is `128 + 9`, SIGKILL. When you see 137 from a container or a CI job, the process was killed with SIGKILL,
very often by the kernel's **out-of-memory killer** (check `dmesg`), or by a limit such as a cgroup's `memory.max`.
""")

code("""
suicide = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'; echo shell saw $?"
print(subprocess.run(["sh", "-c", suicide], capture_output=True, text=True).stdout.strip())
print("Python saw", subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]).returncode)
""")

md("""
## 6. Exercises

**`signal_name(returncode)`**: return the name of the signal that ended a process (`"SIGKILL"`), from Python's
negative return codes (`-9`) or a shell's `128 + n` (`137`), and `None` for a normal exit (0 to 128). Use the
`signal.Signals` enum.
""")

exercise("signal_name", """
import signal

def signal_name(returncode):
    \"\"\"'SIGKILL' for -9 or 137, 'SIGSEGV' for -11 or 139, ...; None for a normal exit status.\"\"\"
    ### BEGIN SOLUTION
    if returncode < 0:
        number = -returncode
    elif returncode > 128:
        number = returncode - 128
    else:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return None
    ### END SOLUTION
""")

check("signal_name", """
def hint(code, wanted, got):
    \"\"\"What is wrong with signal_name(code) == got, when wanted was right.\"\"\"
    if wanted is None:
        return (f"signal_name({code}) gave {got!r}, expected None: {code} is a normal exit status (0 to 128, or no such "
                "signal above 128), no signal")
    if got is None and code > 128:
        return f"signal_name({code}) gave None: reading {code} as \\"error {code}\\", but a shell's {code} is 128 + {code - 128}, a signal ({wanted})"
    if got is None:
        return f"signal_name({code}) gave None: Python's negative return code {code} means killed by signal {-code} ({wanted})"
    if isinstance(got, int):
        return f"signal_name({code}) gave the number {got!r}: return the signal's name, signal.Signals(number).name"
    return f"signal_name({code}) gave {got!r}, expected {wanted!r}: the exact name, signal.Signals(number).name"

def test():
    cases = [(-9, "SIGKILL"), (137, "SIGKILL"), (-11, "SIGSEGV"), (139, "SIGSEGV"), (-15, "SIGTERM"), (143, "SIGTERM"),
             (-24, "SIGXCPU"), (152, "SIGXCPU"), (-6, "SIGABRT"), (130, "SIGINT"),
             (0, None), (1, None), (2, None), (126, None), (127, None), (128, None), (255, None)]
    for code, wanted in cases:
        try:
            got = signal_name(code)
        except ValueError as error:
            raise Feedback(f"signal_name({code}) raised ValueError ({error}): "
                           + (f"{code} - 128 = {code - 128} is no signal, return None" if code > 128 else
                              "0 is no signal: a status up to 128 is a normal exit, return None")) from None
        expect(got == wanted and type(got) is type(wanted), hint(code, wanted, got))
    return "137 means SIGKILL, wherever it comes from"
check("signal_name", test)
""")

md("""
**`read_small_file(path)`**: return the bytes of the file at `path`, read **by a child process** that prints them
base64-encoded on its stdout (the parent never opens the file).
""")

exercise("read_small_file", """
import base64, subprocess, sys

def read_small_file(path):
    \"\"\"Return the bytes of `path`, carried out of a child process as base64 text.\"\"\"
    ### BEGIN SOLUTION
    code = "import base64, sys; sys.stdout.write(base64.b64encode(open(sys.argv[1], 'rb').read()).decode())"
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30)
    return base64.b64decode(result.stdout)
    ### END SOLUTION
""")

check("read_small_file", """
import builtins, pickle, tempfile

def refuse(*args, **kwargs):
    raise Feedback("read_small_file ran what the child printed as Python (eval or pickle.loads), which runs code "
                   "the child chose: decode base64 text with base64.b64decode, it only ever gives bytes")

def test():
    data = bytes(range(256)) * 4
    folder = tempfile.mkdtemp(prefix="it's a folder ")   # a quote and spaces in the path
    path = os.path.join(folder, "data.bin")
    with open(path, "wb") as f:
        f.write(data)
    saved = builtins.eval, builtins.exec, pickle.loads
    builtins.eval = builtins.exec = pickle.loads = refuse
    try:
        got = read_small_file(path)
        stat = read_small_file("/proc/self/stat")   # each process reads its own pid there
    finally:
        builtins.eval, builtins.exec, pickle.loads = saved
        os.remove(path)
        os.rmdir(folder)
    expect(isinstance(got, bytes), f"read_small_file should return bytes, not {type(got).__name__}: decode the base64")
    expect(got or not data, f"got nothing back for a file in {folder!r}: pass the path to the child as an argument "
           "(sys.argv), never pasted into its code, where a quote breaks it")
    expect(len(got) == len(data), f"got {len(got)} bytes back instead of the file's {len(data)}: encode in the child, decode here")
    expect(got == data, "got as many bytes back as the file has, but not the same ones (text mode turns \\\\r into \\\\n, a "
           "decoding changes others): encode in the child with base64, decode here")
    expect(isinstance(stat, bytes) and stat.split()[:1] != [str(os.getpid()).encode()],
           "the file was read by this notebook's own process, not by a child: open it in the child and carry the "
           "bytes out on its stdout")
    return "binary data crosses the process boundary as plain text"
check("read_small_file", test)
""")

md("""
**`what_works()`**: three questions about what stops what. For each one, return the letter of the answer that works.
""")

exercise("what_works", """
QUESTIONS = {
    "secrets": ("What stops a child from reading a file its user can read?", {
        "a": "RLIMIT_NOFILE=3: it cannot open many files",
        "b": "RLIMIT_FSIZE=0: it cannot write files",
        "c": "running it as another user who cannot read the file, or under Landlock",
        "d": "a 1 s wall deadline"}),
    "results": ("How should the parent take a result from a child?", {
        "a": "pickle.loads of the child's stdout",
        "b": "json.loads of the child's stdout",
        "c": "eval of the child's stdout"}),
    "plots": ("A child with no screen draws a plot with matplotlib. What makes that work?", {
        "a": "nothing: matplotlib picks a backend from its configuration and the environment",
        "b": "MPLBACKEND=Agg in the child's environment",
        "c": "DISPLAY=:0 in the child's environment"}),
}

def what_works():
    \"\"\"{question: the letter of the answer that works}, one entry per key of QUESTIONS.\"\"\"
    ### BEGIN SOLUTION
    # Limits are amounts, not access; JSON is data, never code; Agg draws into memory.
    return {"secrets": "c", "results": "b", "plots": "b"}
    ### END SOLUTION
""")

check("what_works", f"""
ANSWERS = {hashed('what_works', {"secrets": "c", "results": "b", "plots": "b"})}
WHY = {sealed("what_works", {
    ("secrets", "a"): "believing rlimits protect your files: a limit counts files, it never asks which",
    ("secrets", "b"): "believing rlimits protect your files: RLIMIT_FSIZE limits writing, reading is untouched",
    ("secrets", "d"): "a deadline limits time, not access: one second is plenty to read a file",
    ("results", "a"): "unpickling what a child sends runs code the child chose: take JSON (or base64 of plain data)",
    ("results", "c"): "eval of what a child sends runs its code: take JSON",
    ("plots", "a"): "leaving matplotlib to pick a backend: with no screen a GUI backend fails or hangs, set MPLBACKEND=Agg",
    ("plots", "c"): "DISPLAY names a screen the child cannot (and should not) reach: set MPLBACKEND=Agg",
})}

def test():
    guesses = what_works()
    expect(isinstance(guesses, dict) and set(guesses) == set(QUESTIONS),
           f"what_works() should return a dict with the keys {{sorted(QUESTIONS)}}")
    for key in ANSWERS:
        got = guesses[key]
        expect(got in QUESTIONS[key][1], f"{{key}}: {{got!r}} is not one of the letters {{sorted(QUESTIONS[key][1])}}")
    for key in wrong_keys("what_works", guesses, ANSWERS):
        got = guesses[key]
        raise Feedback(f"{{key}}: {{got}} ({{QUESTIONS[key][1][got]}}) does not work: {{unseal('what_works', key, got, WHY, 'read the question again')}}")
    return "limits say how much; users, Landlock, JSON and Agg say what"
check("what_works", test)
""")

md("""
## Common mistakes

* **Believing rlimits protect your files.** They limit amounts, not access. Run children as an unprivileged user
  with nothing valuable readable, or add Landlock or a mount namespace (the third exercise).
* **Unpickling what a child sends.** Unpickling runs code; accept JSON, text or base64 of plain data (the third
  exercise).
* **Leaving matplotlib to pick a backend.** It picks from its configuration and the environment; a GUI backend with
  no screen fails or hangs. Set `MPLBACKEND=Agg` (the third exercise).
* **Reading 137 as "error 137".** It is a signal (`128 + 9`, SIGKILL): find out who sent it (the first exercise).
  And not every status above 128 is one: `255` is `128 + 127`, and no signal has the number 127.
* **Pasting a path into the child's code.** A quote in the path breaks the code (or changes it); pass the path as
  an argument (`sys.argv`) (the second exercise).

## Try this next

* `unshare -r -p -f --mount-proc ps ax`: what does a PID namespace see?
* Is Landlock on in your kernel? `cat /sys/kernel/security/lsm` lists the security modules that are active, and
  `landlock` is among them when it is. (That file does not give Landlock's ABI version: the
  `landlock_create_ruleset` system call does, when called with the flag `LANDLOCK_CREATE_RULESET_VERSION`.)

## Key points

* Limits say how much, not what: a limited child can still read every file its user can read and use the network.
* Namespaces (network, PID, mount), Landlock, containers (shared kernel) and virtual machines (own kernel) restrict
  what; each is stronger and heavier than the last.
* Get results out as text on stdout (base64 for small binary files); draw plots with the Agg backend.
* Exit code 137 (or -9 in Python) is SIGKILL, very often the out-of-memory killer.

## The real thing

`cellbox.sandbox` lists the layers that were active for each run in `Outcome.isolation` and, per design rule 8,
reports a layer it could not apply in `Outcome.notes` instead of skipping it silently; the kernel carries rich
output (plots as PNG) over a JSON channel, never by pickling.
""")

answers("""
## Answers to "Try this next"

* Only itself: `ps ax` lists one or two processes (`ps` as pid 1, or the shell and `ps`), because a new PID
  namespace with its own `/proc` (`--mount-proc`) shows only its own processes. Where user namespaces are not
  allowed, `unshare` fails with "Operation not permitted", or under the cellbox kernel with "No space left on
  device" (a cell may make no user namespace).
* For example `landlock,lockdown,yama,...` when Landlock is on. The ABI version, from Python:
  `ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)` (444 is `landlock_create_ruleset`, 1 is
  `LANDLOCK_CREATE_RULESET_VERSION`) returns the version (a small number that grows with new kernels), or -1 when
  Landlock is off or missing. In a container, `/sys/kernel/security` is often not mounted at all; the system call
  still answers.
""")
