"""The pieces of a learner's failure report (llmrs_core.workbook.failures); end to end in test_workbook_mechanics."""

from __future__ import annotations

from llmrs_core.workbook.failures import LINE_LIMIT, RepeatedDiagnoses, diagnosis_key, without_introspection


def test_a_message_drops_pytests_explanation():
    text = "every value must be within half a step\nassert np.False_\n +  where np.False_ = all(array([1, 2]))"
    assert without_introspection(text) == "every value must be within half a step"
    two_lines = "first line\nsecond line\nassert x == y"
    assert without_introspection(two_lines) == "first line\nsecond line"


def test_a_bare_assert_keeps_its_explanation_cut_to_the_limit():
    long = "assert -1 == 3\n +  where -1 = add(" + "x" * 500 + ")"
    kept = without_introspection(long).split("\n")
    assert kept[0] == "assert -1 == 3" and len(kept[1]) == LINE_LIMIT and kept[1].endswith("…")


def test_diagnoses_differing_only_in_numbers_are_one():
    assert diagnosis_key("AssertionError", "scale 0.5 over 16 rows, 1e-3") == \
        diagnosis_key("AssertionError", "scale 12.25 over 8 rows, 2.5E+4")
    assert diagnosis_key("AssertionError", "scale 1") != diagnosis_key("ValueError", "scale 1")
    seen = RepeatedDiagnoses()
    assert seen.seen("AssertionError", "off by 3", "test_a[1]") is None
    assert seen.seen("AssertionError", "off by 4", "test_a[2]") == "test_a[1]"
    assert seen.seen("AssertionError", "swapped nibbles", "test_b") is None
    line = RepeatedDiagnoses.one_line("AssertionError", "off by 4\nmore", "test_a[1]")
    assert line == "AssertionError: off by 4  (the same diagnosis as test_a[1], shown in full above)"


def test_a_helpers_long_diagnosis_is_kept_whole():
    long = "your attention differs from the reference by up to 0.3; first at " + "query 3, head 1, " * 20
    assert without_introspection(long) == long
