"""A program that never finishes on its own: ``cellbox run --wall 1 examples/sleep_forever.py``.

Sleeping burns no CPU, so the CPU limit never stops it; the wall clock does
(status ``timed_out``).
"""

import time

print("going to sleep")
while True:
    time.sleep(60)
