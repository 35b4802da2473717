"""Verdicts: the severity order a row's several symptoms resolve by, and which ones count as failed."""

from __future__ import annotations

from difftest.core.verdict import SEVERITY, Verdict, worst


def test_severity_order():
    assert SEVERITY == (Verdict.CRASH, Verdict.TIMEOUT, Verdict.ERROR, Verdict.FAIL_MUTATED_INPUT,
                        Verdict.FAIL_SANITIZER, Verdict.FAIL_UNWRITTEN, Verdict.FAIL_NAN, Verdict.FAIL_MASK,
                        Verdict.FAIL_GARBAGE, Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE, Verdict.FAIL_PADDING,
                        Verdict.FAIL_MISSING, Verdict.FAIL_NONDETERMINISTIC, Verdict.FAIL_VALUE, Verdict.FAIL_ORDER,
                        Verdict.FAIL_METAMORPHIC, Verdict.PASS, Verdict.SKIP), f"{SEVERITY=}"
    assert set(SEVERITY) == set(Verdict), "every verdict has a rank"
    for i, worse in enumerate(SEVERITY):
        for better in SEVERITY[i + 1:]:
            assert worst([better, worse]) == worse and worst([worse, better]) == worse, f"{worse=}, {better=}"
    assert worst([]) == Verdict.PASS


def test_failed_property():
    assert {v for v in Verdict if v.failed} == set(Verdict) - {Verdict.PASS, Verdict.SKIP}
    assert Verdict.FAIL_MASK.value == "FAIL(mask)" and Verdict.FAIL_UNWRITTEN.value == "FAIL(unwritten)"
