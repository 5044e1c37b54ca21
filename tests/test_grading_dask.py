"""``--dask ADDRESS``: the same verdicts and figures as local grading, from tasks on a dask.distributed cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.cli import main
from grading_cases import CASES, DAEMON_MARKER, write_cases, write_suite
from sandboxkit import survivors

distributed = pytest.importorskip("distributed")

NAMES = ["honest", "buggy", "broken_import", "forged_channel", "daemon"]
COMPARED = ("verdict", "reason", "passed", "failed", "errors", "total", "score")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as local:
        yield local.scheduler_address


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


def test_unreachable_scheduler_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_suite(tmp_path / "tests")
    write_cases(tmp_path / "subs", ["honest"])
    status = main(
        [
            "grade",
            str(tmp_path / "subs"),
            "--tests",
            str(tmp_path / "tests"),
            "--out",
            str(tmp_path / "out"),
            "--dask",
            "tcp://127.0.0.1:9",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "cannot reach the dask scheduler at tcp://127.0.0.1:9" in err
