"""One token set per curve: a later `posbench eval` scores the run's own tokens, refuses lengths that
cannot score them, and moves a run to a new set only by computing every row again; the report
refuses a line that mixes sets (posbench.eval.token_set)."""

import numpy as np
import pandas as pd
import pytest
from conftest import posbench

from posbench.config import EvalConfig
from posbench.errors import PosbenchError
from posbench.eval.token_nll import read_token_nll
from posbench.eval.token_set import fitting, scored_count

pytestmark = pytest.mark.slow

FILES = ("results.csv", "positions.csv", "token_nll.npz")


def snapshot(run):
    return {name: (run / name).read_bytes() for name in FILES}


def refused(proc) -> str:
    """The one line a refused command printed (it exits 2, with no traceback)."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stderr.strip().splitlines()[-1]


def test_a_later_eval_scores_the_runs_tokens_and_refuses_lengths_that_cannot(smoke_run_copy):
    run = smoke_run_copy  # trained at 32, scored at 32 .. 512 on 2,048 validation tokens (experiment=smoke)

    def posbench_eval(*args, check=True):
        return posbench("eval", f"checkpoint={run}", "device=cpu", *args, check=check)

    before = pd.read_csv(run / "results.csv").set_index("eval_len")
    assert set(before.tokens) == {2048}
    # eval.max_tokens is not given: the run's set, where the command's default (131,072) would draw another
    posbench_eval("eval.lengths=[32,1024,2048]")
    after = pd.read_csv(run / "results.csv").set_index("eval_len")
    assert after.index.tolist() == [32, 64, 128, 256, 512, 1024, 2048] and set(after.tokens) == {2048}
    assert after.loc[before.index, "nll"].tolist() == before.nll.tolist()  # kept, not scored again
    assert {v.size for v in read_token_nll(run / "token_nll.npz").values()} == {2048}

    files = snapshot(run)
    line = refused(posbench_eval("eval.lengths=[48,64]", check=False))
    assert line.startswith("posbench: error: eval_len 48 cannot score the 2,048 validation tokens that ")
    assert "valid: lengths that fit (32, 64, 128, 256, 512, 1,024, 2,048)" in line
    assert "eval.recompute=true 'eval.lengths=[32,48,64,128,256,512,1024,2048]'" in line
    line = refused(posbench_eval("eval.lengths=[32]", "eval.max_tokens=1024", check=False))
    assert "eval.max_tokens=1024 scores 1,024 tokens at these lengths, but" in line and "score 2,048" in line
    line = refused(posbench_eval("eval.lengths=[32,64]", "eval.max_tokens=1024", "eval.recompute=true", check=False))
    assert "would score these lengths on 1,024 tokens" in line and "(eval_len 128, 256, 512, 1,024, 2,048)" in line
    assert snapshot(run) == files  # nothing written by a refused evaluation


def test_a_recompute_that_would_leave_rows_behind_is_refused_and_one_that_covers_them_moves_the_set(smoke_run_copy):
    run = smoke_run_copy

    def posbench_eval(*args, check=True):
        return posbench("eval", f"checkpoint={run}", "device=cpu", *args, check=check)

    files = snapshot(run)
    line = refused(posbench_eval("eval.lengths=[32,64]", "eval.max_tokens=1024", "eval.recompute=true", check=False))
    assert "would score these lengths on 1,024 tokens" in line and "(eval_len 128, 256, 512)" in line
    assert snapshot(run) == files
    posbench_eval("eval.lengths=[32,64,128,256,512]", "eval.max_tokens=1024", "eval.recompute=true")
    df = pd.read_csv(run / "results.csv")
    assert set(df.tokens) == {1024} and len(df) == 5
    assert {v.size for v in read_token_nll(run / "token_nll.npz").values()} == {1024}
    assert set(pd.read_csv(run / "positions.csv").groupby("eval_len").tokens.sum()) == {1024}
    # a new protocol pairs with the run's other one where its lengths fit it
    posbench_eval("eval.lengths=[32,64]", "eval.mode=sliding")
    df = pd.read_csv(run / "results.csv")
    assert set(df[df["mode"] == "sliding"].tokens) == {1024}


def test_runs_that_mix_token_sets_are_refused_by_eval_and_report(smoke_run_copy, tmp_path):
    run = smoke_run_copy
    df = pd.read_csv(run / "results.csv")
    df.loc[df.eval_len.isin([32, 128]), "tokens"] = 1024  # as an evaluation before one set per curve wrote it
    df.to_csv(run / "results.csv", index=False)
    line = refused(posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[64]", check=False))
    assert "rows in validation, nonoverlapping mix token sets (2,048 tokens at eval_len 64, 256, 512; 1,024 tokens " \
           "at eval_len 32, 128)" in line
    assert line.endswith("valid: eval.recompute=true 'eval.lengths=[32,64,128,256,512]' scores them all again "
                         "on one set")
    out = tmp_path / "report"
    line = refused(posbench("report", run, "--out", out, check=False))
    assert line == (f"posbench: error: report: line 'alibi' of {run} scores other tokens at other lengths (2,048 at "
                    "64, 256, 512; 1,024 at 32, 128 validation tokens), so its curve compares other text; evaluate it "
                    f"again on one set: posbench eval checkpoint={run} eval.recompute=true "
                    "'eval.lengths=[32,64,128,256,512]'")
    assert not out.exists()
    posbench("eval", f"checkpoint={run}", "device=cpu", "eval.recompute=true", "eval.lengths=[32,64,128,256,512]")
    assert set(pd.read_csv(run / "results.csv").tokens) == {2048}
    posbench("report", run, "--out", out)


def test_the_count_is_the_held_set_where_lengths_fit_it(tmp_path):
    ecfg = EvalConfig(max_tokens=4096)
    tokens = np.zeros(10_000, dtype=np.int64)
    results = tmp_path / "results.csv"
    assert scored_count(results, tokens, [64, 192], ecfg, "none") == 4032  # no rows: 21 x lcm 192, within 4,096
    pd.DataFrame({"encoding": "rope", "rope_scaling": "none", "train_len": 64, "eval_len": [64, 128],
                  "seed": 0, "split": "validation", "mode": "nonoverlapping", "stride": [64, 128],
                  "tokens": 3072}).to_csv(results, index=False)
    assert scored_count(results, tokens, [256, 1024], ecfg, "yarn", budget_given=False) == 3072
    with pytest.raises(PosbenchError, match=r"eval_len 2,048 cannot score the 3,072"):
        scored_count(results, tokens, [1024, 2048], ecfg, "yarn", budget_given=False)
    with pytest.raises(PosbenchError, match=r"eval.max_tokens=4096 scores 4,096 tokens"):
        scored_count(results, tokens, [1024], ecfg, "none")
    assert scored_count(results, tokens, [64, 128], EvalConfig(max_tokens=4096, recompute=True), "none") == 4096
    with pytest.raises(PosbenchError, match=r"\(none at 64, 128\)"):  # another scaling's rows stay behind
        scored_count(results, tokens, [64, 128], EvalConfig(max_tokens=4096, recompute=True), "yarn")
    sliding = EvalConfig(mode="sliding", stride=48)
    assert fitting(sliding, 3072, [64, 96, 192]) == [96, 192]  # (3,072 - 64) / 48 strides is not whole
