"""per.png (posbench/report/per.py): each line against a --per key's values, drawn from the table's
numbers, and left out where the key's values are not a numeric axis."""

import numpy as np
import pytest
from test_verdicts import summary_of

from posbench.report.per import per_figure, per_rows

LINES = {"x [steps=488]": (3.0, 0.1, 0.005), "y [steps=488]": (3.05, 0.8, 0.005),
         "x [steps=1221]": (2.5, 0.1, 0.005), "y [steps=1221]": (2.6, 0.8, 0.005),
         "t5 [bias_scale=none, steps=122]": (4.0, 0.3, 0.005), "t5 [bias_scale=none, steps=1221]": (2.7, 0.3, 0.005)}


def test_rows_are_named_without_the_key_and_valued_by_it():
    rows = per_rows(summary_of(LINES, per=["train.steps"]), "train.steps")
    assert sorted(set(zip(rows.name, rows.value))) == sorted(
        [("t5 [bias_scale=none]", 122), ("t5 [bias_scale=none]", 1221), ("x", 488), ("x", 1221),
         ("y", 488), ("y", 1221)])


def test_each_line_is_one_curve_through_its_budgets_with_the_table_s_values():
    summary = summary_of(LINES, per=["train.steps"])
    fig = per_figure(summary, "train.steps")
    ppl_ax, ratio_ax = fig.axes
    for ax, column, length in ((ppl_ax, "ppl_mean", 128), (ratio_ax, "ratio_mean", 2048)):
        curves = {c.get_label(): c.lines[0] for c in ax.containers}  # one errorbar per line
        assert sorted(curves) == ["t5 [bias_scale=none]", "x", "y"]
        for name, budgets in (("x", [488, 1221]), ("t5 [bias_scale=none]", [122, 1221])):
            xs, ys = curves[name].get_data()
            assert list(xs) == budgets  # in budget order
            want = [summary[(summary.label == label) & (summary.eval_len == length)][column].iloc[0]
                    for label in ([f"{name} [steps={b}]" for b in budgets] if name == "x"
                                  else [f"t5 [bias_scale=none, steps={b}]" for b in budgets])]
            np.testing.assert_allclose(np.asarray(ys, dtype=float), want)
    assert ratio_ax.get_title() == "ppl(2048) / ppl(128) (16x)"


@pytest.mark.parametrize("lines", [
    {"x [steps=488]": (3.0, 0.1, 0.005), "y [steps=488]": (3.0, 0.2, 0.005)},          # one value
    {"x [steps=long]": (3.0, 0.1, 0.005), "x [steps=short]": (3.0, 0.2, 0.005)},       # not numbers
])
def test_no_figure_without_two_numeric_values(lines):
    assert per_figure(summary_of(lines, per=["train.steps"]), "train.steps") is None
