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

import builtins as _builtins
import contextlib as _contextlib
import hashlib as _hashlib
import signal as _signal
import subprocess as _subprocess
import sys as _sys
import threading as _threading
import time as _time

PASS, FAIL, TODO = "\u2714", "\u2718", "\u2026"
CHECK_SECONDS = 20  # a whole check cell gives up after this, well inside the kernel's 30 s wall limit

# Captured now, before any student code runs: code under test may replace builtins.print (an `exec` in this
# process does exactly that), and the check must still be able to say so.
_print, _type, _isinstance, _str = _builtins.print, _builtins.type, _builtins.isinstance, _builtins.str


class Feedback(Exception):
    """A check found something wrong; the message is one sentence for the student."""


def expect(condition, message):
    """Raise Feedback(message) unless condition is true."""
    if not condition:
        raise Feedback(message)


class _Overdue(BaseException):
    """A check's own deadline passed.  Not an Exception, so ``except Exception`` in the code under test lets it by."""


@_contextlib.contextmanager
def deadline(seconds, message):
    """Raise Feedback(message) if the block still runs after ``seconds`` (float, seconds).

    A SIGALRM timer (setitimer(2), ITIMER_REAL) interrupts whatever the block waits on, and rings again every
    second, so a ``finally:`` in the code under test that blocks again is interrupted too.  Nested deadlines
    put the outer one back, less the time spent.  Outside the main thread (no signals there) it only runs the block.
    """
    if _threading.current_thread() is not _threading.main_thread():
        yield
        return

    def ring(signum, frame):
        raise _Overdue(message)

    started = _time.monotonic()
    previous = _signal.signal(_signal.SIGALRM, ring)
    outer, every = _signal.setitimer(_signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    except _Overdue as late:
        raise Feedback(_str(late.args[0])) from None
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, previous)
        if outer:
            _signal.setitimer(_signal.ITIMER_REAL, max(outer - (_time.monotonic() - started), 0.01), every)


def digest(exercise, key, value):
    """A short SHA-256 of one answer (``repr`` of the value), so a check cell holds answers without showing them."""
    return _hashlib.sha256(f"{exercise}|{key}|{value!r}".encode()).hexdigest()[:16]


def wrong_keys(exercise, guesses, digests):
    """The keys of ``guesses`` (in the order of ``digests``) whose value is not the answer ``digests`` holds."""
    return [key for key in digests if digest(exercise, key, guesses.get(key)) != digests[key]]


def _keystream(exercise, key, value, size):
    seed = f"{exercise}|{key}|{value!r}|hint".encode()
    blocks = (_hashlib.sha256(seed + n.to_bytes(4, "big")).digest() for n in range(size // 32 + 1))
    return b"".join(blocks)[:size]


def seal(exercise, key, value, hint):
    """``(index, box)``: ``hint`` (str) for the answer ``value`` to ``key``, readable only with that answer.

    The index is a digest of the answer and the box the hint's UTF-8 XORed with a SHA-256 stream of it, so a check
    cell holding boxes shows neither which answers have a hint nor what a hint says (lessons/build.py's sealed).
    """
    data = hint.encode()
    box = bytes(a ^ b for a, b in zip(data, _keystream(exercise, key, value, len(data))))
    return digest(exercise, f"hint:{key}", value), box.hex()


def unseal(exercise, key, value, boxes, default):
    """The hint ``boxes`` (from ``seal``) holds for the answer ``value`` to ``key``, or ``default`` (str)."""
    box = boxes.get(digest(exercise, f"hint:{key}", value))
    if box is None:
        return default
    data = bytes.fromhex(box)
    return bytes(a ^ b for a, b in zip(data, _keystream(exercise, key, value, len(data)))).decode()


def _hint(name, error):
    """One sentence for an exception a student's function often raises, or None."""
    text = _str(error)
    if _isinstance(error, ProcessLookupError):
        return (f"{name} raised ProcessLookupError ({text}): the process or group it signalled had already ended "
                "and been collected; catch ProcessLookupError around os.kill/os.killpg, it means nothing was left")
    if _isinstance(error, ValueError) and "limit" in text:
        return (f"{name} raised ValueError from setrlimit ({text}): a process may lower its limits but never raise "
                "a hard limit again, so set limits in the child (preexec_fn), not in the notebook")
    if _isinstance(error, _subprocess.SubprocessError) and "preexec_fn" in text:
        return (f"{name}: the preexec_fn raised in the child, which never started ({text}); often setrlimit "
                "refused a value, such as a soft limit above the hard one")
    if _isinstance(error, _subprocess.TimeoutExpired):
        return f"{name} let subprocess.TimeoutExpired escape: catch it and return a result instead"
    if _isinstance(error, SystemExit):
        return (f"{name} raised SystemExit({text!r}): the code under test ended the process it ran in; "
                "run it in a child process instead")
    if _isinstance(error, NameError):
        return f"{name} raised NameError: {text}; if it comes from an earlier cell, run the cells above first"
    return None


def check(name, test):
    """Run test() and print one line about exercise ``name``.

    test() returns a short description of what now works, or raises Feedback.  A NotImplementedError (the
    scaffold) and any other exception become feedback too: a check cell never raises, whatever the code under
    test did to builtins or to sys.stdout (both are put back before the line is printed).
    """
    saved_builtins = dict(vars(_builtins))
    saved_streams = _sys.stdout, _sys.stderr
    try:
        with deadline(CHECK_SECONDS, f"the check gave up after {CHECK_SECONDS} s, with {name} still running: "
                      "something in it waits without a deadline"):
            done = test()
    except NotImplementedError:
        line = f"{TODO} {name}: not done yet: replace the NotImplementedError in {name}"
    except Feedback as problem:
        line = f"{FAIL} {name}: {problem}"
    except KeyboardInterrupt:
        line = f"{FAIL} {name}: the check was interrupted before it finished"
    except BaseException as error:  # the student's code failed in a way the check did not foresee
        line = _hint(name, error) or f"{name} raised {_type(error).__name__}: {error}"
        line = f"{FAIL} {line}"
    else:
        line = f"{PASS} {name}: {done or 'correct'}"
    changed = sorted(key for key, value in saved_builtins.items() if vars(_builtins).get(key) is not value)
    vars(_builtins).update(saved_builtins)
    _sys.stdout, _sys.stderr = saved_streams
    if changed and line.startswith(PASS):
        line = (f"{FAIL} {name}: the code under test replaced this notebook's own builtins ({', '.join(changed)}): "
                "it ran in this process, so run it in a child process instead")
    _print(line)
