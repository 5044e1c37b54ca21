"""cellbox: run untrusted Python for teaching.

The sandbox core (:mod:`cellbox.sandbox.limits`, :mod:`cellbox.sandbox.environment`,
:mod:`cellbox.sandbox`, :mod:`cellbox.sandbox.outcome`) imports nothing from Jupyter,
pytest or Dask; the kernel and the grader start children only through it.
"""

from .sandbox import SandboxError, run, start
from .sandbox.limits import LimitError, Limits
from .sandbox.outcome import Outcome, Status

__version__ = "0.1.0"

__all__ = ["Limits", "LimitError", "Outcome", "Status", "SandboxError", "run", "start", "__version__"]
