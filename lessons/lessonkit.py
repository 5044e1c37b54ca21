"""Check helpers for the lesson notebooks: friendly, one-sentence feedback that never crashes a notebook.

The build (lessons/build.py) copies this file into the first, hidden cell of every lesson, so a notebook needs
nothing beside it: not under the cellbox kernel, not when ``cellbox grade`` turns it into a module.

A check cell looks like this::

    def test():
        ok, out, err = run_isolated("print(42)")
        expect(ok is True, f"run_isolated returned {ok!r} for code that succeeds: did you compare returncode with 0?")
        return "runs code in a child and reports success"
    check("run_isolated", test)
"""

PASS, FAIL, TODO = "\u2714", "\u2718", "\u2026"


class Feedback(Exception):
    """A check found something wrong; the message is one sentence for the student."""


def expect(condition, message):
    """Raise Feedback(message) unless condition is true."""
    if not condition:
        raise Feedback(message)


def check(name, test):
    """Run test() and print one line about exercise ``name``.

    test() returns a short description of what now works, or raises Feedback.  A NotImplementedError
    (the scaffold) and any other exception become feedback too: a check cell never raises.
    """
    try:
        done = test()
    except NotImplementedError:
        print(f"{TODO} {name}: not done yet: replace the NotImplementedError in {name}")
    except Feedback as problem:
        print(f"{FAIL} {name}: {problem}")
    except NameError as error:
        print(f"{FAIL} {name} raised NameError: {error}; if it comes from an earlier cell, run the cells above first")
    except Exception as error:  # the student's code failed in a way the check did not foresee
        print(f"{FAIL} {name} raised {type(error).__name__}: {error}")
    else:
        print(f"{PASS} {name}: {done or 'correct'}")
