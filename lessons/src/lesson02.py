lesson(2, "in-process-sandboxes-fail", "In-process sandboxes fail")

md("""
# Lesson 2: in-process sandboxes fail

**Goal:** see for yourself why "just take away the dangerous builtins" cannot make `eval` safe, and where the
boundary has to go instead.

**The plan.** We build the two classic home-made sandboxes: `eval` with no builtins, and a filter that rejects
source code mentioning dangerous words. Then we break both with a few characters of ordinary Python. Finally you
write such an escape yourself, and we look at where real isolation lives.
""")

md("""
## 1. Attempt one: take the builtins away

`eval(text, globals)` looks names up in `globals`, and builtins such as `open` and `__import__` in
`globals["__builtins__"]`. Give it an empty dictionary there, and `open` seems to be gone.
""")

code("""
def locked_eval(expression):
    \"\"\"Evaluate an expression with no builtins at all (this is NOT safe, as we will see).\"\"\"
    return eval(expression, {"__builtins__": {}})

for attempt in ["1 + 2", "open('/etc/hostname').read()", "__import__('os').getpid()"]:
    try:
        print(f"{attempt!r:35} -> {locked_eval(attempt)!r}")
    except Exception as error:
        print(f"{attempt!r:35} -> refused: {type(error).__name__}: {error}")
""")

md("""
It looks locked. But every Python object knows its class, every class knows its base classes, and `object` knows
**every class that inherits from it**. A tuple literal needs no builtins at all:

* `()` is a tuple; `().__class__` is `tuple`; `tuple.__base__` is `object`;
* `object.__subclasses__()` lists every class loaded in the interpreter, including classes defined inside `os`;
* a Python function knows the module it was defined in through `function.__globals__`.
""")

code("""
classes = ().__class__.__base__.__subclasses__()
print(len(classes), "classes reachable from an empty tuple, for example:")
print([c.__name__ for c in classes][:12])

wrap_close = [c for c in classes if c.__name__ == "_wrap_close"][0]   # a small class defined in the os module
print(wrap_close, "->", wrap_close.__init__.__globals__["__name__"], "module globals")
del classes   # we do not need the list any more
""")

md("""
So, with no builtins at all, this expression reaches the `os` module, which can run programs, delete files and
read secrets. We only ask for the process id, but `system` is one key away.
""")

code("""
escape = "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0].__init__.__globals__['getpid']()"
print("locked_eval returned", locked_eval(escape))
import os
print("our process id is  ", os.getpid())
""")

md("""
## 2. Attempt two: filter the source text

Perhaps we could refuse code that *mentions* dangerous names? A denylist of words is easy to write, and just as
easy to walk around, because Python can build any name from pieces at run time.
""")

code("""
FORBIDDEN = ("import", "open", "os", "eval", "exec", "subclasses", "globals")

def filtered_exec(source):
    \"\"\"Run `source` unless it contains a forbidden word (this is NOT safe either).\"\"\"
    for word in FORBIDDEN:
        if word in source:
            return f"refused: mentions {word!r}"
    scope = {}
    exec(source, scope)
    return scope.get("result")

print(filtered_exec("import os; result = os.getpid()"))
sneaky = "m = __builtins__['__imp' + 'ort__']('o' + 's'); result = getattr(m, 'getp' + 'id')()"
print(filtered_exec(sneaky))
""")

md("""
The filter refused the honest version and ran the sneaky one, which reached `os` again and returned the process
id. (Under the cellbox kernel every cell runs in a fresh process, so it is not the number printed above.)

## 3. This is not just us

People have tried hard to make this work, and the authors themselves concluded it cannot be done:

* **pysandbox** restricted a CPython interpreter from the inside. After years of escapes its author declared the
  project *broken by design* and withdrew it.
* **RestrictedPython** (used by Zope) compiles a restricted subset of Python; its own documentation says it is
  **not a sandbox** and must not be relied on to contain hostile code.

The lesson: the boundary must sit **below the interpreter**, where Python's introspection cannot reach it. The
operating system enforces it whatever the code does.

```mermaid
flowchart TB
    A["inside the interpreter: eval tricks, import filters<br/><b>not a boundary</b>"] --> B
    B["process: separate memory, resource limits, a scrubbed environment<br/>(lessons 1, 3-9)"] --> C
    C["namespaces and Landlock: own network, PIDs, mounts, file access<br/>(lesson 12)"] --> D
    D["containers: shared kernel"] --> E["virtual machines: own kernel,<br/>boundary at the hypervisor"]
```
""")

md("""
## 4. Exercise: your own escape

Write `reach_os()` returning an **expression** (a string) that, evaluated by `locked_eval`, returns the current
process id, as `os.getpid()` does. Do not copy `escape` above: use a different route, for example
`catch_warnings`, a class of the `warnings` module whose instances keep that module in `._module`, and every
module keeps the builtins in `__builtins__`.
""")

exercise("reach_os", """
def reach_os():
    \"\"\"Return an expression (str) that evaluates to os.getpid() even with no builtins.\"\"\"
    ### BEGIN SOLUTION
    return ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()"
            "._module.__builtins__['__import__']('os').getpid()")
    ### END SOLUTION
""")

check("reach_os", """
import os, subprocess, sys

def test():
    expression = reach_os()
    expect(isinstance(expression, str), f"reach_os should return the expression as a string, not {type(expression).__name__}")
    expect("_wrap_close" not in expression, "that is the escape from above (through _wrap_close): find another route, "
           "for example through catch_warnings")
    try:
        value = eval(expression, {"__builtins__": {}})
    except SyntaxError as error:
        raise Feedback(f"eval could not read it ({error.msg}): return one expression, not a statement such as "
                       "import; eval evaluates expressions only") from None
    except NameError as error:
        raise Feedback(f"the expression used a builtin that is not there ({error}): start from () instead") from None
    except AttributeError as error:
        if "'dict' object" not in str(error):
            raise
        raise Feedback(f"the expression used __builtins__ as if it were always a module ({error}): in the warnings "
                       "module it is a dict, so write __builtins__['__import__']") from None
    expect(not callable(value), f"the expression evaluated to {value!r}, a function: call it, getpid()")
    expect(value == os.getpid(), f"the expression evaluated to {value!r}, not the process id {os.getpid()}")
    # Another process has another id: an expression that really asks the OS gives that one.
    probe = f"import os, subprocess, warnings; print(eval({expression!r}, {{'__builtins__': {{}}}}) == os.getpid())"
    with deadline(10, "evaluating the expression in another process did not end within 10 s"):
        other = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    said = (other.stderr.strip().splitlines() or [""])[-1]
    expect(other.stdout.strip() != "False", "in another process the expression did not give that process's id: it "
           "is this notebook's process id written out, not computed; reach os.getpid and call it")
    expect(other.stdout.strip() == "True", f"in a new Python process (with os, subprocess and warnings imported) the "
           f"expression failed ({said}): it leans on something only this notebook has loaded")
    return "no builtins, and still the os module: an in-process sandbox is no boundary"
check("reach_os", test)
""")

md("""
## 5. Exercise: fix a broken loader

A grading script reads each student's scores from a text file holding a Python dict literal, such as
`{"ada": 9, "bob": 7}`, with `load_scores` below. It "locks" `eval` the way section 1 did. Fix it: return the dict
for data, and raise `ValueError` for anything that is not a plain literal, **without running it**. The standard
library has the tool: `ast.literal_eval` accepts only literals (strings, numbers, tuples, lists, dicts, sets,
booleans, `None`) and never calls anything.
""")

exercise("load_scores", """
import ast

def load_scores(text):
    \"\"\"The dict written in `text`; ValueError for anything that is not a plain dict literal.\"\"\"
    # The broken version: return eval(text, {"__builtins__": {}})
    ### BEGIN SOLUTION
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
        raise ValueError(f"not a plain literal: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a dict, got {type(value).__name__}")
    return value
    ### END SOLUTION
""")

check("load_scores", """
import ast

def test():
    for text in ('{"ada": 9, "bob": 7}', "{'ada': 9, 'bob': 7}", "{'ada': -1, 'ok': True, 'note': None}", "{}"):
        try:
            got = load_scores(text)
        except ValueError as error:
            raise Feedback(f"load_scores refused the plain dict literal {text} ({error}): "
                           "json.loads, say, reads JSON only (double quotes, true, null); a Python literal needs "
                           "ast.literal_eval") from None
        expect(got == ast.literal_eval(text) and isinstance(got, dict), f"the plain dict literal {text} gave {got!r}")
    refused = []
    attacks = (escape, "{'pid': " + escape + "}", "__import__('os').getpid()", "{'a': (lambda: 1)()}",
               "{'ada': 9 if True else 0}", "{'ada': 'x' * 3}", "{'ada': ada}")
    for attack in attacks:
        try:
            value = load_scores(attack)
        except ValueError:
            refused.append(attack)
            continue
        except (SyntaxError, NameError, TypeError) as error:
            raise Feedback(f"load_scores raised {type(error).__name__} for code: catch it and raise ValueError") from None
        if refused:
            raise Feedback(f"load_scores refused {len(refused)} attack(s) but ran {attack!r} and returned {value!r}: "
                           "believing a denylist is finished; parse data with ast.literal_eval instead of filtering code")
        raise Feedback(f"load_scores ran code and returned {value!r}: eval with no builtins is still eval, use ast.literal_eval")
    for broken in ("import os", "{'ada': 9"):
        try:
            load_scores(broken)
        except ValueError:
            pass
        except SyntaxError:
            raise Feedback(f"load_scores let SyntaxError escape for {broken!r}, which is not Python at all: "
                           "catch SyntaxError too and raise ValueError") from None
        else:
            raise Feedback(f"load_scores accepted {broken!r}: raise ValueError for it")
    for other in ("[1, 2, 3]", "[('ada', 9)]", "{1, 2}", "'ada'"):
        try:
            got = load_scores(other)
        except ValueError:
            continue
        except TypeError:
            raise Feedback(f"load_scores raised TypeError for {other}: check isinstance(value, dict) and raise "
                           "ValueError, rather than converting with dict()") from None
        raise Feedback(f"{other} is not a dict literal but load_scores gave {got!r}: check isinstance(value, dict) "
                       "and raise ValueError otherwise")
    return "data is parsed, never run"
check("load_scores", test)
""")

md("""
## Common mistakes

* **Believing a denylist is finished.** Every filter above missed something; an attacker only needs one gap.
* **Using `__builtins__` as if it were always a module.** In the main program it is the `builtins` module, in
  other modules and in `exec` scopes it is a dictionary: `__builtins__['__import__']` (the first exercise).
* **Forgetting that `eval` of a *literal* is a different thing.** For data, use `ast.literal_eval` or `json.loads`,
  which never run code.

## Try this next

* Print `[c.__name__ for c in ().__class__.__base__.__subclasses__()]` and look for other classes whose
  methods have a `__globals__` that leads to `sys` or `os`.
* Try `locked_eval("(lambda: 0).__globals__")`: what do you get, and why?

## Key points

* Taking builtins away from `eval`, or filtering the source text, is not a sandbox: introspection starting from
  `()` reaches every class, and from there the `os` module.
* The authors of pysandbox and RestrictedPython say so themselves.
* The boundary belongs below the interpreter: a separate process with limits, then namespaces, containers, VMs.
* For data, use `ast.literal_eval` or `json.loads`, which never run code.

## The real thing

cellbox never runs student code in its own interpreter: `cellbox.sandbox` starts a separate, limited process
for every cell and every graded submission, and the parent only ever reads JSON and text back (design rule 6).
""")

answers("""
## Answers to "Try this next"

* Many do: any class defined in Python (not C) has methods whose `__globals__` is its module's namespace, for
  example `catch_warnings` (module `warnings`, which imports `sys`), `_wrap_close` (module `os`) or classes of
  `subprocess` and `codecs` when they are loaded. Which classes are there depends on what the interpreter has
  imported so far.
* You get a dict: the globals that `locked_eval` passed in, `{'__builtins__': {}}`. A lambda defined in the
  expression gets the evaluation's globals; emptying them removed the names, not the way out through `()`.
""")
