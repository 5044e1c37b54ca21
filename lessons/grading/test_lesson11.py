"""Hidden tests for lesson 11 (verdict, badge_colour, what_counts),
run by ``cellbox grade`` against 11-the-three-state-verdict.ipynb."""

import importlib

import pytest

NOTEBOOK, MODULE = "11-the-three-state-verdict.ipynb", "nb_11_the_three_state_verdict"


@pytest.fixture(scope="module")
def nb():
    for name in (MODULE, "submission"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
    pytest.fail(f"no notebook for this lesson: submit {NOTEBOOK}")


TESTS = {"test_a", "test_b", "test_c"}
ALL_PASSED = {name: "passed" for name in TESTS}


def test_verdict_verified_needs_complete_evidence(nb):
    assert nb.verdict(0, TESTS, ALL_PASSED) == "verified"
    assert nb.verdict(0, TESTS, {"test_a": "passed", "test_b": "passed"}) == "unverified"
    assert nb.verdict(0, TESTS, None) == "unverified"


def test_verdict_needs_exactly_the_expected_names(nb):
    assert nb.verdict(0, TESTS, {**ALL_PASSED, "test_extra": "passed"}) == "unverified"
    assert nb.verdict(0, TESTS, {"test_a": "passed", "test_b": "passed", "test_x": "passed"}) == "unverified"
    assert nb.verdict(1, TESTS, {"test_a": "failed", "test_b": "passed", "test_x": "passed"}) == "unverified"


def test_verdict_failed_on_exit_1_with_failures(nb):
    assert nb.verdict(1, TESTS, {"test_a": "passed", "test_b": "failed", "test_c": "passed"}) == "failed"


def test_verdict_unverified_when_tests_never_ran(nb):
    failed = {"test_a": "passed", "test_b": "failed", "test_c": "passed"}
    for code in (2, 3, 4, 5, 6, -9):
        for evidence in ({}, ALL_PASSED, failed):
            assert nb.verdict(code, TESTS, evidence) == "unverified", f"exit {code} with {evidence}"
    assert nb.verdict(1, TESTS, None) == "unverified"


def test_verdict_errors_and_skips_are_failed(nb):
    assert nb.verdict(1, TESTS, {"test_a": "passed", "test_b": "error", "test_c": "passed"}) == "failed"
    assert nb.verdict(0, TESTS, {"test_a": "passed", "test_b": "skipped", "test_c": "passed"}) == "failed"


def test_verdict_unverified_when_exit_and_evidence_disagree(nb):
    assert nb.verdict(1, TESTS, ALL_PASSED) == "unverified"
    assert nb.verdict(0, TESTS, {"test_a": "passed", "test_b": "failed", "test_c": "passed"}) == "unverified"
    assert nb.verdict(0, TESTS, {"test_a": "passed", "test_b": "error", "test_c": "passed"}) == "unverified"


def test_verdict_timed_out_comes_first(nb):
    assert nb.verdict(0, TESTS, ALL_PASSED, timed_out=True) == "timed_out"
    assert nb.verdict(2, TESTS, None, timed_out=True) == "timed_out"


def test_badge_colour_by_exact_label(nb):
    assert nb.badge_colour("TESTS VERIFIED") == "green"
    assert nb.badge_colour("TESTS FAILED") == "red"
    assert nb.badge_colour("TESTS TIMED OUT") == "orange"
    for label in ("TESTS UNVERIFIED", "UNVERIFIED TESTS VERIFIED", "tests verified", "VERIFIED",
                  "TESTS VERIFIED (stale)", " TESTS VERIFIED ", "Tests Verified", "NOT TESTS VERIFIED",
                  "TESTS FAILED (2)", "tests timed out", "TESTS  VERIFIED", ""):
        assert nb.badge_colour(label) == "grey"


def test_what_counts_is_the_graders_own_channel(nb):
    assert nb.what_counts() == {"source": "b", "forged": "b"}
