"""cellbox: run untrusted Python for teaching.

The sandbox core (:mod:`cellbox.limits`, :mod:`cellbox.environment`,
:mod:`cellbox.sandbox`, :mod:`cellbox.outcome`) imports nothing from Jupyter,
pytest or Dask; the kernel and the grader start children only through it.
"""

from .limits import LimitError, Limits
from .outcome import Outcome, Status
from .sandbox import SandboxError, run, start

__version__ = "0.1.0"

__all__ = ["Limits", "LimitError", "Outcome", "Status", "SandboxError", "run", "start", "__version__"]
