"""``--dask ADDRESS``: the same verdicts and figures as local grading, from tasks on a dask.distributed cluster.

The cluster authenticates (mutual TLS with credentials of the run): nothing a
submission runs, its build backend included, gets code onto a worker, even
with the grader's ``distributed`` in reach (isolation ``none``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellbox.cli import main
from cellbox.grading.cluster import ClusterError, cluster_security, local_cluster
from cellbox.grading.venvs import grader_site_hidden
from grading_cases import CASES, DAEMON_MARKER, write_cases, write_suite, write_tree
from sandboxkit import survivors

# Each test starts a Dask cluster and grades on it: heavy, left to CI and -m slow.
pytestmark = pytest.mark.slow

distributed = pytest.importorskip("distributed")
pytest.importorskip("cryptography")
import dask  # noqa: E402
from distributed.security import Security  # noqa: E402

NAMES = ["honest", "buggy", "broken_import", "forged_channel", "daemon"]
COMPARED = ("verdict", "reason", "passed", "failed", "errors", "total", "score")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A TLS cluster (workers as threads of this process), its client credentials in the dask config."""
    security = Security.temporary()
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        protocol="tls",
        host="127.0.0.1",
        security=security,
        dashboard_address=None,
    ) as local:
        with dask.config.set(client_credentials(security)):
            yield local.scheduler_address


def client_credentials(security: Any) -> dict[str, str]:
    return {
        "distributed.comm.tls.ca-file": security.tls_ca_file,
        "distributed.comm.tls.client.cert": security.tls_client_cert,
        "distributed.comm.tls.client.key": security.tls_client_key,
    }


def graded(tmp_path: Path, name: str, *extra: str) -> dict[str, dict]:  # type: ignore[type-arg]
    out = tmp_path / name
    assert (
        main(
            [
                "grade",
                str(tmp_path / "subs"),
                "--tests",
                str(tmp_path / "tests"),
                "--out",
                str(out),
                "--wall",
                "10",
                *extra,
            ]
        )
        == 0
    )
    rows = json.loads((out / "results.json").read_text())["submissions"]
    return {
        row["id"]: {key: row[key] for key in COMPARED} | {"tests": [(t["nodeid"], t["outcome"]) for t in row["tests"]]}
        for row in rows
    }


def test_dask_results_are_identical_to_local_results(tmp_path: Path, cluster: str) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", NAMES)
    on_cluster = graded(tmp_path, "dask", "--dask", cluster)
    local = graded(tmp_path, "local", "--jobs", "2")
    assert on_cluster == local
    assert {key: row["verdict"] for key, row in on_cluster.items()} == {name: CASES[name][1] for name in NAMES}
    assert survivors(DAEMON_MARKER) == []


def grade_status(tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str) -> tuple[int, str]:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest"])
    argv = ["grade", str(tmp_path / "subs"), "--tests", str(tmp_path / "tests"), "--out", str(tmp_path / "out")]
    status = main([*argv, "--dask", address])
    return status, capsys.readouterr().err


def test_unreachable_scheduler_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set(client_credentials(Security.temporary())):
        status, err = grade_status(tmp_path, capsys, "tls://127.0.0.1:9")
    assert status == 2
    assert err.count("\n") == 1 and "cannot reach the dask scheduler at tls://127.0.0.1:9" in err


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "127.0.0.1:8786", "ws://127.0.0.1:8786"])
def test_unauthenticated_scheduler_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str
) -> None:
    status, err = grade_status(tmp_path, capsys, address)
    assert status == 2 and err.count("\n") == 1
    scheme = address.partition("://")[0] if "://" in address else "tcp"
    assert f"--dask {address}: a {scheme}:// scheduler runs code for anyone who reaches it; give a tls:// " in err
    assert "--dask local" in err
    assert not (tmp_path / "out").exists()


def test_tls_scheduler_without_client_credentials_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        status, err = grade_status(tmp_path, capsys, "tls://127.0.0.1:8786")
    assert status == 2 and err.count("\n") == 1
    assert "no TLS client credentials in the dask config; set distributed.comm.tls.ca-file, " in err


def test_the_runs_own_cluster_accepts_only_its_credentials() -> None:
    with local_cluster(0) as (address, security):
        assert address.startswith("tls://127.0.0.1:")
        # Without a certificate of this run's: no TLS context, or a certificate of another CA.
        for other in (Security(), Security.temporary()):
            with pytest.raises((OSError, TypeError, ValueError)):
                distributed.Client(address, security=other, timeout="3s", set_as_default=False)
        with distributed.Client(address, security=security, timeout="10s", set_as_default=False) as client:
            assert client.scheduler_info()["address"] == address


def test_cluster_security_takes_the_credentials_of_the_dask_config() -> None:
    credentials = client_credentials(Security.temporary())
    with dask.config.set(credentials):
        security = cluster_security("tls://scheduler.example:8786")
    assert security.require_encryption is True
    assert security.tls_client_cert == credentials["distributed.comm.tls.client.cert"]
    with pytest.raises(ClusterError, match=r"^--dask tcp://x:1: a tcp:// scheduler"):
        cluster_security("tcp://x:1")


# ---------------------------------------------------------------------- a submission attacking the cluster

# An in-tree build backend that borrows the grader's distributed and submits, to every address it knows,
# a function that writes a marker on the worker (and would read the hidden tests). Its fib is wrong.
ATTACK_BACKEND = """
import os, sys

def _attack():
    sys.path.extend({sites!r})
    try:
        import distributed
        from distributed.security import Security
    except ImportError as exc:
        return f"no distributed: {{exc}}"
    tried = []
    for address in {addresses!r}:
        for security in (None, Security.temporary()):
            try:
                client = distributed.Client(address, security=security, timeout="3s", set_as_default=False)
                client.run(lambda: open({marker!r}, "w").write("ran on a worker"))
                client.submit(lambda: open({marker!r}, "w").write("ran as a task")).result()
                tried.append("submitted")
            except Exception as exc:
                tried.append(type(exc).__name__)
    return tried

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import base64, hashlib, zipfile
    tried = _attack()
    try:  # what it tried, where a run without isolation can write it
        with open({tried_file!r}, "w") as f:
            f.write(repr(tried))
    except OSError:
        pass
    name = "attack_fib-1.0-py3-none-any.whl"
    files = {{
        "fib.py": "def fib(n):\\n    return n\\n",
        "attack_fib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: attack-fib\\nVersion: 1.0\\n",
        "attack_fib-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\n"
        "Tag: py3-none-any\\n",
    }}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
            wheel.writestr(path, data)
        record.append("attack_fib-1.0.dist-info/RECORD,,")
        wheel.writestr("attack_fib-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""
ATTACK_PYPROJECT = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "attack-fib"
version = "1.0"
"""


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_a_build_backend_cannot_run_code_on_the_cluster(tmp_path: Path, cluster: str, isolation: str) -> None:
    # With isolation none the backend has the network and the grader's distributed: only TLS stops it.
    marker = tmp_path / "marker"
    address = cluster.removeprefix("tls://")
    backend = ATTACK_BACKEND.format(
        sites=list(grader_site_hidden()[0]),
        addresses=[cluster, f"tcp://{address}", address],
        marker=str(marker),
        tried_file=str(tmp_path / "tried"),
    )
    write_suite(tmp_path / "tests")
    write_tree(tmp_path / "subs" / "mallory", {"pyproject.toml": ATTACK_PYPROJECT, "backend.py": backend})
    out = tmp_path / "out"
    argv = ["grade", str(tmp_path / "subs"), "--tests", str(tmp_path / "tests"), "--out", str(out)]
    assert main([*argv, "--wall", "120", "--isolation", isolation, "--dask", cluster]) == 0
    [row] = json.loads((out / "results.json").read_text())["submissions"]
    assert row["verdict"] in ("failed", "unverified"), row["reason"]
    assert row["verdict"] == "failed", (row["reason"], row["install"])  # its wrong fib, installed and graded
    assert not marker.exists()
    if isolation == "none":
        # It had the grader's distributed and the network: every client it made was refused (no TLS context,
        # a certificate of another CA, plain TCP to a TLS listener), none submitted anything.
        tried = (tmp_path / "tried").read_text()
        assert tried.startswith("[") and "submitted" not in tried and tried.count("'") == 12, tried


def test_the_runs_own_cluster_serves_no_http_pages() -> None:
    import urllib.error
    import urllib.request

    with local_cluster(0) as (address, security):
        with distributed.Client(address, security=security, timeout="10s", set_as_default=False) as client:
            port = client.scheduler_info()["services"]["dashboard"]
        for page in ("info/main/workers.html", "json/identity.json", "health"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/{page}", timeout=10)
            assert info.value.code == 404


def test_dask_local_grades_on_worker_processes_of_its_own(tmp_path: Path) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest", "buggy"])
    rows = graded(tmp_path, "local-cluster", "--dask", "local", "--jobs", "1")
    assert {key: row["verdict"] for key, row in rows.items()} == {"honest": "verified", "buggy": "failed"}
