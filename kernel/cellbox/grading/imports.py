"""Which modules a submission may serve to the tests: its own, never a library the tests expect from the grader.

The tests' imports are resolved in the trusted test process: the standard
library, the grader's installed packages and the tests' own folder first; only
a top-level name none of them has can reach the submission
(:class:`cellbox.grading.bridge.SubmissionFinder`).  That alone would let a
submission answer ``import numpy`` with a fake ``numpy/`` whose
``assert_allclose`` agrees with anything, when the grader's Python lacks numpy.
So a name is *the submission's own module* only when all of these hold:

* the submission offers it (a module or package in its folder, or what its
  install put in its virtualenv: :func:`cellbox.grading.connection.offered_modules`);
* the instructor named it with ``--modules``, or, without ``--modules``:
  it is not a name of pytest, of the grader, or of a test configuration
  (:data:`NEVER_SERVED`), not the import name of a known distribution
  (:data:`KNOWN_DISTRIBUTIONS`), and not a requirement the submission's
  ``requirements.txt`` or package names.

A test that imports a name the grader's Python lacks and that is not the
submission's own makes the run ``unverified``, with the one line of
:func:`missing_reason` (the module and the command that installs it beside
cellbox).  Names are compared as they are written; nothing is imported here.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

__all__ = [
    "KNOWN_DISTRIBUTIONS",
    "NEVER_SERVED",
    "own_modules",
    "missing_reason",
    "distribution_of",
    "is_library",
    "refused",
]

# Names a submission never serves: pytest and its plugins' packages, the grader's own, test configuration.
NEVER_SERVED = frozenset(
    {
        "pytest", "_pytest", "py", "pluggy", "iniconfig", "conftest", "pytest_timeout", "xdist", "hypothesis",
        "cellbox", "cellbox_worker", "cellbox_plain", "cellbox_gateway_base", "execnet", "packaging", "pip",
        "setuptools", "pkg_resources", "_distutils_hack", "wheel", "distributed", "dask", "sitecustomize",
        "usercustomize",
    }
)  # fmt: skip

# Import name -> distribution of libraries that tests commonly expect from the grader's Python.
KNOWN_DISTRIBUTIONS = {
    "numpy": "numpy", "scipy": "scipy", "pandas": "pandas", "matplotlib": "matplotlib", "sklearn": "scikit-learn",
    "skimage": "scikit-image", "PIL": "pillow", "cv2": "opencv-python", "yaml": "pyyaml", "bs4": "beautifulsoup4",
    "requests": "requests", "httpx": "httpx", "sympy": "sympy", "networkx": "networkx", "torch": "torch",
    "tensorflow": "tensorflow", "keras": "keras", "jax": "jax", "polars": "polars", "pyarrow": "pyarrow",
    "statsmodels": "statsmodels", "seaborn": "seaborn", "plotly": "plotly", "numba": "numba", "attr": "attrs",
    "attrs": "attrs", "pydantic": "pydantic", "dateutil": "python-dateutil", "pytz": "pytz", "tqdm": "tqdm",
    "rich": "rich", "click": "click", "flask": "flask", "django": "django", "fastapi": "fastapi", "jinja2": "jinja2",
    "lxml": "lxml", "psutil": "psutil", "numpy_financial": "numpy-financial", "xarray": "xarray", "h5py": "h5py",
    "shapely": "shapely", "geopandas": "geopandas", "nltk": "nltk", "spacy": "spacy", "transformers": "transformers",
    "IPython": "ipython", "ipykernel": "ipykernel", "nbformat": "nbformat", "nbclient": "nbclient",
    "jupyter_client": "jupyter-client", "traitlets": "traitlets", "zmq": "pyzmq", "toml": "toml", "tomli": "tomli",
    "typing_extensions": "typing-extensions", "six": "six", "more_itertools": "more-itertools", "sqlalchemy":
    "sqlalchemy", "Bio": "biopython", "astropy": "astropy", "mpmath": "mpmath", "joblib": "joblib",
}  # fmt: skip

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def distribution_of(requirement: str) -> str:
    """The import name a requirement most likely gives (``Foo-Bar>=1`` -> ``foo_bar``), or ``""``."""
    found = _NAME.match(requirement.strip())
    return found.group(0).lower().replace("-", "_").replace(".", "_") if found else ""


def own_modules(
    offered: Iterable[str], requirements: Iterable[str] = (), named: Iterable[str] | None = None
) -> list[str]:
    """The names of ``offered`` that are the submission's own modules (rules in the module docstring).

    Args:
        offered: top-level names the submission offers.
        requirements: the PEP 508 requirements it installs (their names are libraries, not its own).
        named: the instructor's ``--modules``, or ``None`` to decide by the rules.
    """
    if named is not None:
        return sorted(set(offered) & set(named))
    libraries = {distribution_of(text) for text in requirements}
    known = {name.lower() for name in KNOWN_DISTRIBUTIONS}
    return sorted(
        name
        for name in set(offered)
        if name not in NEVER_SERVED and name.lower() not in known and name.lower() not in libraries
    )


def is_library(name: str) -> bool:
    """Whether ``name`` is one no submission ever serves by the default rules (pytest's, the grader's, a library)."""
    return name in NEVER_SERVED or name.lower() in {known.lower() for known in KNOWN_DISTRIBUTIONS}


def refused(name: str, named: Iterable[str] | None, withheld: Iterable[str] = ()) -> bool:
    """Whether a test's import of ``name`` (which the grader's Python lacks) may not be answered by the submission.

    ``named`` is the instructor's ``--modules`` (``None``: the default rules);
    ``withheld`` the names the submission offers that are not its own.
    """
    if named is not None:
        return name not in set(named)
    return is_library(name) or name in set(withheld)


def missing_reason(name: str) -> str:
    """One line: the tests import ``name``, which the grader's Python lacks, and the command that installs it."""
    distribution = KNOWN_DISTRIBUTIONS.get(name, name.replace("_", "-"))
    return (
        f"the tests import {name}, which the grader's Python lacks and the submission may not provide: "
        f"install it beside cellbox ({sys.executable} -m pip install {distribution})"
    )
