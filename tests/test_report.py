"""posbench report on small hand-made run dirs (results.csv, token_nll.npz, positions.csv,
passkey.csv, config.yaml): seeds averaged and nothing else, sliding windows and RoPE scalings as
their own lines, Markdown/LaTeX tables with intervals, verdicts only where intervals support
them, the extrapolation summary, and the figures' content."""

import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, SMOKE, posbench
from posbench.errors import PosbenchError
from posbench.report.figures import DPI, INTERVAL_LABEL, passkey_figure, positions_figure, ppl_figure
from posbench.report.build import REFERENCE, read_reference, report
from posbench.report.collect import collect
from posbench.report.render import extrapolation_summary, latex_table, markdown_table
from posbench.report.summary import summarize
from posbench.eval.results import read_results
from posbench.eval.token_nll import merge_token_nll, row_key

COLUMNS = ["encoding", "rope_scaling", "train_len", "eval_len", "seed", "split", "mode", "stride", "rope_factor",
           "ppl", "nll", "bpb", "word_ppl", "tokens", "bytes", "words", "status", "model", "data", "steps",
           "init_len", "params", "pos_params", "config_hash", "code_version", "unigram_ppl"]


def rows(encoding, seed, ppl: dict, scaling="none", mode="nonoverlapping", stride=None, chash="h1", train_len=32):
    """One run's results rows in the current results.csv format; NaN ppl means 'n/a'."""
    out = []
    for eval_len, p in ppl.items():
        out.append({"encoding": encoding, "rope_scaling": scaling, "train_len": train_len, "eval_len": eval_len,
                    "seed": seed, "split": "validation", "mode": mode, "stride": stride or eval_len,
                    "rope_factor": 1.0, "ppl": p, "nll": math.log(p) if p == p else math.nan, "bpb": 1.0,
                    "word_ppl": 2 * p, "tokens": 2048, "bytes": 8000, "words": 1500,
                    "status": "ok" if p == p else "n/a: table too short", "model": "tiny", "data": "sotu",
                    "steps": 10, "config_hash": chash, "code_version": "0.1.0+abc"})
    return pd.DataFrame(out, columns=COLUMNS)


def write_token_nll(path: Path, df: pd.DataFrame, own: float = 0.05) -> None:
    """token_nll.npz for the ok rows: ln(ppl) plus the same difficulty pattern in every row (every
    row scores the same text) plus ``own`` noise of each row's, both exactly mean zero."""
    arrays = {}
    for i, r in df[df.status == "ok"].iterrows():
        n = int(r.tokens)
        rng = np.random.default_rng([r.seed, r.eval_len, i, *map(ord, r.encoding + r["mode"])])
        x = np.random.default_rng(0).normal(0, 1.0, n) + rng.normal(0, own, n)
        arrays[row_key(r)] = math.log(r.ppl) + x - x.mean()
    merge_token_nll(path / "token_nll.npz", arrays)


def write_run(path: Path, *frames, lr=0.001, steps=10, encoding=None, tokens=True) -> Path:
    """A run dir: results.csv, token_nll.npz (unless not ``tokens``) plus the config.yaml whose hashed
    keys the rows' config_hash stands for."""
    path.mkdir(parents=True)
    df = pd.concat(frames, ignore_index=True)
    df.to_csv(path / "results.csv", index=False)
    if tokens:
        write_token_nll(path, df)
    config = {"encoding": {"name": str(df.encoding.iloc[0]), **(encoding or {})}, "train": {"lr": lr, "steps": steps, "train_len": 32},
              "seed": int(df.seed.iloc[0]), "eval": {"max_tokens": 2048 * (1 + int(df.seed.iloc[0]))},
              "wandb": {"mode": "disabled"}, "data": {"name": "sotu", "cache_dir": f"/tmp/c{df.seed.iloc[0]}"}}
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    return path


@pytest.fixture
def sweep(tmp_path):
    """alibi (2 seeds), nope (1 seed, n/a past 64), alibi sliding/16 (2 seeds)."""
    s = tmp_path / "sweep"
    write_run(s / "alibi/seed=0", rows("alibi", 0, {32: 10.0, 64: 10.5, 128: 11.0, 256: 11.2}),
              rows("alibi", 0, {32: 9.0, 64: 9.5}, mode="sliding", stride=16))
    write_run(s / "alibi/seed=1", rows("alibi", 1, {32: 12.0, 64: 12.5, 128: 12.0, 256: 13.2}),
              rows("alibi", 1, {32: 9.5, 64: 9.0}, mode="sliding", stride=16))
    write_run(s / "nope/seed=0", rows("nope", 0, {32: 10.5, 64: 10.0, 128: math.nan, 256: math.nan}, chash="h2"))
    return s


def test_old_results_read_with_neutral_values(tmp_path):
    old = rows("alibi", 0, {32: 10.0, 64: 11.0}).drop(columns=["rope_scaling", "rope_factor", "mode", "stride", "bpb",
                                                               "word_ppl", "bytes", "words"])
    old.to_csv(tmp_path / "results.csv", index=False)
    df = read_results(tmp_path / "results.csv")
    assert df.columns.tolist() == COLUMNS + ["execution", "scaling", "method", "method_window", "method_group"]
    assert df.execution.isna().all()  # how it trained: not recorded then
    assert df.scaling.tolist() == df.method.tolist() == ["none", "none"]
    assert df[["method_window", "method_group"]].isna().all().all()
    assert df["mode"].tolist() == ["nonoverlapping"] * 2 and df.stride.tolist() == [32, 64]
    assert df.rope_scaling.tolist() == ["none", "none"] and df.rope_factor.tolist() == [1.0, 1.0]
    assert df[["bpb", "word_ppl", "bytes", "words", "params", "pos_params"]].isna().all().all()


def test_summary_averages_seeds_and_keeps_sliding_windows_apart(sweep):
    summary = summarize(collect([sweep]))
    alibi = summary[summary.label == "alibi"].set_index("eval_len")
    # the geometric mean, the centre of the interval (exp of the mean NLL), and the std of the ppls
    assert alibi.loc[32, "ppl_mean"] == pytest.approx(math.sqrt(120)) and alibi.loc[32, "ppl_std"] == pytest.approx(math.sqrt(2))
    assert (alibi.loc[32, "ppl_min"], alibi.loc[32, "ppl_max"], alibi.loc[32, "seeds"]) == (10.0, 12.0, 2)
    sliding = summary[summary.label == "alibi sliding/16"].set_index("eval_len")
    assert sliding.ppl_mean.to_dict() == pytest.approx({32: math.sqrt(85.5), 64: math.sqrt(85.5)})
    assert (sliding.stride == 16).all()
    assert summary.label.unique().tolist() == ["alibi", "alibi sliding/16", "nope"]

    # two seeds: their spread and the text's (block bootstrap over the scored tokens); one seed: the
    # text's; both around exp(mean NLL)
    ok = summary.dropna(subset=["ppl_mean"])
    assert (ok.block_tokens == 103).all()  # 2,048 tokens, 20 blocks
    assert (ok.ci_method == ok.seeds.map({2: "seeds+text", 1: "text (1 seed)"})).all()
    assert ((ok.ppl_ci_low < np.exp(ok.nll_mean)) & (np.exp(ok.nll_mean) < ok.ppl_ci_high)).all()
    assert summary[summary.ppl_mean.isna()].ci_method.eq("none").all()

    table = markdown_table(summary).splitlines()
    assert table[0] == "| encoding | train_len | seeds | L=32 | L=64 | L=128 | L=256 |"
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[4:-1]] for line in table[2:]}
    number, ci = r"\d+\.\d\d", r" \[\d+\.\d\d, \d+\.\d\d\]"
    assert cells["alibi"][0] == "**10.95 ± 1.41 [4.59, 26.16]**" and re.fullmatch(f"\\*\\*10\\.50{ci}\\*\\*", cells["nope"][0])
    # lowest ppl per column in bold, and every line not apart from it beyond their intervals: two
    # seeds 20% apart give alibi an interval at t with about 1 df, tied with everything; nope n/a
    # past 64, alibi the only line left
    bold = {label: [c.startswith("**") for c in row] for label, row in cells.items()}
    assert bold == {"alibi": [True, True, True, True], "alibi sliding/16": [True, True, False, False],
                    "nope": [True, True, False, False]}
    assert cells["alibi sliding/16"][2:] == ["", ""] and cells["nope"][2:] == ["n/a", "n/a"]
    assert all(re.fullmatch(f"(\\*\\*)?{number}( ± {number})?{ci}(\\*\\*)?", c) for row in cells.values()
               for c in row if c not in ("", "n/a"))


def test_table_has_a_parameter_column_when_rows_carry_counts(tmp_path):
    with_counts = lambda df, params, pos: df.assign(params=params, pos_params=pos)
    write_run(tmp_path / "a", with_counts(rows("alibi", 0, {32: 10.0, 64: 12.0}), 5_252_608, 0))
    write_run(tmp_path / "b", with_counts(rows("complex", 0, {32: 11.0, 64: 11.5}, chash="h2"), 8_398_336, 3_145_728))
    write_run(tmp_path / "c", with_counts(rows("kerple_log", 0, {32: 10.5, 64: 12.5}, chash="h3"), 5_252_624, 16))
    summary = summarize(collect([tmp_path]))
    assert summary.set_index(["label", "eval_len"]).loc[("complex", 64), ["params", "pos_params"]].tolist() == \
        [8_398_336, 3_145_728]
    table = markdown_table(summary).splitlines()
    assert table[0] == "| encoding | train_len | seeds | params (position) | L=32 | L=64 |"
    assert [line.split(" | ")[:4] for line in table[2:]] == [["| alibi", "32", "1", "5.25M (0)"],
                                                             ["| complex", "32", "1", "8.40M (3.15M)"],
                                                             ["| kerple_log", "32", "1", "5.25M (16)"]]
    assert table[3].split(" | ")[4].startswith("11.00 [")  # the ppl cells follow, with their intervals
    tex = latex_table(summary).splitlines()
    assert tex[4] == r"encoding & $L_\mathrm{train}$ & seeds & params (position) & $L=32$ & $L=64$ \\"
    assert tex[7].startswith(r"complex & 32 & 1 & 8.40M (3.15M) & 11.00")


def test_latex_table_is_booktabs_with_escaped_names_and_bold_best(tmp_path):
    write_run(tmp_path / "a", rows("kerple_log", 0, {32: 10.0, 64: 12.0}))
    write_run(tmp_path / "b", rows("rope", 0, {32: 11.0, 64: 11.5}, scaling="dynamic_ntk", chash="h3"))
    tex = latex_table(summarize(collect([tmp_path]))).splitlines()
    assert tex[:4] == [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{lrrrr}", r"\toprule"]
    assert tex[4] == r"encoding & $L_\mathrm{train}$ & seeds & $L=32$ & $L=64$ \\" and tex[5] == r"\midrule"
    ci = r" \[\d+\.\d\d, \d+\.\d\d\]"
    assert re.fullmatch(rf"kerple\\_log & 32 & 1 & \\textbf\{{10\.00{ci}\}} & 12\.00{ci} \\\\", tex[6]), tex[6]
    assert re.fullmatch(rf"rope\+dynamic\\_ntk & 32 & 1 & 11\.00{ci} & \\textbf\{{11\.50{ci}\}} \\\\", tex[7]), tex[7]
    assert tex[8:10] == [r"\bottomrule", r"\end{tabular}"] and tex[-1] == r"\end{table}"
    assert r"mean $\pm$ std over seeds [95\% interval covering the seeds' spread and the text's" in tex[-3]


def test_lines_of_one_model_apart_at_train_len_are_warned_of_as_inference_methods(tmp_path):
    """Lines that differ only in an inference-time method are one model, which the method changes
    inside its context: the warning says so, and keeps 'stages of training' for other lines."""
    write_run(tmp_path / "a", rows("rope", 0, {32: 100.0, 64: 300.0}))
    write_run(tmp_path / "b", rows("rope", 0, {32: 130.0, 64: 135.0}, scaling="rerope(W=8)", chash="h2"))
    warning = [line for line in extrapolation_summary(summarize(collect([tmp_path]))) if "warning" in line]
    assert warning == ["  warning: at train_len=32 rope+rerope(W=8) differs from rope by more than their 95% "
                       "intervals: one model under different inference-time methods, which change it inside its "
                       "context: each ratio ppl(L) / ppl(train_len) is to its own line's ppl at train_len"]
    write_run(tmp_path / "c", rows("t5", 0, {32: 160.0, 64: 170.0}, chash="h3"))
    warning = [line for line in extrapolation_summary(summarize(collect([tmp_path]))) if "warning" in line]
    assert warning == ["  warning: at train_len=32 rope+rerope(W=8), t5 differ from rope by more than their 95% "
                       "intervals: the ratios ppl(L) / ppl(train_len) compare models at different stages of training"]


def test_extrapolation_summary_ratio_and_how_far_within_ten_percent(tmp_path):
    write_run(tmp_path / "a", rows("rope", 0, {32: 100.0, 64: 105.0, 128: 108.0, 256: 115.0}))
    write_run(tmp_path / "b", rows("t5", 0, {32: 100.1, 64: 120.0, 128: 105.0, 256: 104.0}, chash="h2"))
    write_run(tmp_path / "c", rows("learned", 0, {32: 150.0, 64: math.nan, 128: math.nan, 256: math.nan}, chash="h3"))
    write_run(tmp_path / "d", rows("xpos", 0, {32: 100.0, 64: 110.0, 128: 100.0, 256: 100.0}, chash="h4"))
    summary = summarize(collect([tmp_path]))
    lines = extrapolation_summary(summary)
    ci = r"\[(\d+\.\d\d\d), (\d+\.\d\d\d)\]"
    spread = re.fullmatch(r"train_len=32: ppl at train_len spans 100\.00 \.\. 150\.00 across 4 encodings "
                          r"\(highest / lowest 1\.500 " + ci + r"\)", lines[0])
    assert spread and float(spread[1]) <= 1.5 <= float(spread[2]), lines[0]
    # rope, t5 and xpos are 0.1% apart at train_len, within their intervals; learned is not
    assert lines[1] == ("  warning: at train_len=32 learned differs from rope by more than their 95% intervals: "
                        "the ratios ppl(L) / ppl(train_len) compare models at different stages of training")
    assert [re.sub(ci, "[ci]", line) for line in lines[2:]] == [
        "  learned: ppl(L=256) / ppl(L=32) = n/a; within 10% of ppl(L=32) up to L=32 (1x)",
        "  rope: ppl(L=256) / ppl(L=32) = 1.150 [ci]; within 10% of ppl(L=32) up to L=128 (4x)",
        "  t5: ppl(L=256) / ppl(L=32) = 1.039 [ci]; within 10% of ppl(L=32) up to L=32 (1x)",  # 20% above at 2x
        # exactly 10% above at 2x: its interval straddles the bound, so no verdict past 1x
        "  xpos: ppl(L=256) / ppl(L=32) = 1.000 [ci]; within 10% of ppl(L=32) up to L=32 (1x); "
        "L=64: not distinguishable from 10%",
    ]
    rope = summary[summary.encoding == "rope"].set_index("eval_len")
    low, high = rope.ratio_ci_low, rope.ratio_ci_high
    assert (rope.ratio_method == "text (1 seed)").all() and (low[32], high[32]) == (1, 1)
    assert (low < rope.ratio_mean).iloc[1:].all() and (rope.ratio_mean < high).iloc[1:].all()
    # the paired ratio interval is far narrower than either cell's
    assert (rope.ratio_ci_high / rope.ratio_ci_low).iloc[1:].max() < 1.01 < (rope.ppl_ci_high / rope.ppl_ci_low).min()


def test_no_verdict_without_an_interval_and_t_over_three_seeds(tmp_path):
    """Runs without per-token NLL and fewer than 3 seeds have no interval: no bold, no verdict.
    Three seeds get the t-interval of the seeds' mean NLLs, t_{0.975, 2} = 4.303 (tables)."""
    for seed, (a, b) in enumerate([(10.0, 10.5), (11.0, 11.2), (12.0, 13.0)]):
        write_run(tmp_path / f"alibi{seed}", rows("alibi", seed, {32: a, 64: b}), tokens=False)
    write_run(tmp_path / "nope", rows("nope", 0, {32: 20.0, 64: 21.0}, chash="h2"), tokens=False)
    summary = summarize(collect([tmp_path]))
    alibi = summary[summary.encoding == "alibi"].set_index("eval_len")
    x = np.log([10.0, 11.0, 12.0])
    half = 4.302653 * x.std(ddof=1) / math.sqrt(3)
    assert alibi.loc[32, "ci_method"] == "t" and pd.isna(alibi.loc[32, "block_tokens"])
    assert alibi.loc[32, ["ppl_ci_low", "ppl_ci_high"]].tolist() == pytest.approx(np.exp(x.mean() + np.array([-half, half])))
    d = np.log([10.5 / 10, 11.2 / 11, 13.0 / 12])  # each seed's ratio: paired by seed
    half = 4.302653 * d.std(ddof=1) / math.sqrt(3)
    assert alibi.loc[64, "ratio_method"] == "t"  # the seeds only: no per-token NLL
    assert alibi.loc[64, ["ratio_ci_low", "ratio_ci_high"]].tolist() == pytest.approx(np.exp(d.mean() + np.array([-half, half])))
    assert alibi.loc[64, "ratio_mean"] == pytest.approx(np.exp(d.mean()))  # geometric: the interval's centre
    nope = summary[summary.encoding == "nope"]
    assert (nope.ci_method == "none").all() and nope.ppl_ci_low.isna().all() and nope.tied_best.isna().all()
    assert "**" not in markdown_table(summary)  # alibi vs nope (1 seed, no tokens) cannot be compared
    lines = extrapolation_summary(summary)
    assert lines[0] == "train_len=32: ppl at train_len spans 10.97 .. 20.00 across 2 encodings (highest / lowest 1.823)"
    assert lines[-1] == ("  nope: ppl(L=64) / ppl(L=32) = 1.050 [no interval]; within 10% of ppl(L=32) up to L=32 (1x); "
                         "L=64: no interval")


def test_refuses_to_average_runs_whose_configs_differ(tmp_path):
    a = write_run(tmp_path / "a", rows("alibi", 0, {32: 10.0}, chash="h1"), lr=0.001)
    b = write_run(tmp_path / "b", rows("alibi", 1, {32: 11.0}, chash="h2"), lr=0.002)
    with pytest.raises(PosbenchError) as e:
        report([a, b], tmp_path / "out")
    # seed, eval and data.cache_dir differ too, but the hash leaves them out
    assert str(e.value) == (f"report: cannot average alibi runs whose configs differ in train.lr (0.001 in {a}, "
                            f"0.002 in {b}); pass fewer dirs, so that each line's runs differ only in seed, or --by "
                            "train.lr to draw each value as a line of its own")
    assert not (tmp_path / "out").exists()
    (b / "config.yaml").unlink()
    with pytest.raises(PosbenchError, match=f"differ in config_hash \\(h1 in {a}, h2 in {b}; no config.yaml"):
        report([a, b], tmp_path / "out")
    # the same dir twice is one run, not two seeds
    assert report([a, a / "results.csv"], tmp_path / "out").summary.seeds.tolist() == [1]


def test_by_tells_runs_apart_by_a_config_key(tmp_path):
    runs = [write_run(tmp_path / f"{scale}/seed={seed}", rows("t5", seed, {32: 10.0 + seed + (scale == "none"), 64: 11.0 + seed},
                                                         chash=scale), encoding={"bias_scale": scale})
            for scale in ("none", "sqrt_head_dim") for seed in (0, 1, 2)]
    with pytest.raises(PosbenchError, match=r"differ in encoding.bias_scale \(none in .*; .* or --by encoding.bias_scale "):
        report(runs, tmp_path / "out")
    summary = report(runs, tmp_path / "out", by=["encoding.bias_scale"]).summary
    assert sorted(set(summary.label)) == ["t5 [bias_scale=none]", "t5 [bias_scale=sqrt_head_dim]"]
    at32 = summary[summary.eval_len == 32].set_index("label")
    assert at32.seeds.tolist() == [3, 3] and at32.ci_method.tolist() == ["seeds+text", "seeds+text"]
    assert at32.loc["t5 [bias_scale=none]", "ppl_mean"] == pytest.approx((11 * 12 * 13) ** (1 / 3))  # geometric
    assert at32.loc["t5 [bias_scale=sqrt_head_dim]", "ppl_mean"] == pytest.approx((10 * 11 * 12) ** (1 / 3))
    assert "| t5 [bias_scale=none] |" in (tmp_path / "out/report.md").read_text()
    # two keys, one that some runs predate ('unset'), and the CLI's comma form
    proc = posbench("report", *runs, "--out", tmp_path / "cli", "--by", "encoding.bias_scale,train.steps", "--no-reference")
    assert "t5 [bias_scale=none, steps=10]" in proc.stdout
    for key, message in [("encoding", "names a config group, not a key; valid: one of its keys, e.g. "
                                      "encoding.bias_scale, encoding.name"),
                         ("encoding.bias_scal", "is not a key of any run's config; valid: a dotted key such as "
                                                "encoding.bias_scale, encoding.name, or dir (the dir given that "
                                                "holds each run)")]:
        bad = posbench("report", *runs, "--out", tmp_path / "bad", "--by", key, check=False)
        assert bad.returncode == 2 and bad.stderr.strip() == f"posbench: error: report: --by {key!r} {message}"
        assert not (tmp_path / "bad").exists()


def test_a_seed_in_two_runs_is_refused_and_by_dir_tells_them_apart(tmp_path, monkeypatch):
    """The same config and seed exported to two folders (a study's copy beside the shipped one) would
    pool as two seeds of one line and narrow its interval: the report stops, names both runs and
    leaves no out dir; ``--by dir`` makes each path given a line of its own."""
    monkeypatch.chdir(tmp_path)
    for where in ("shipped", "again"):
        for seed in (0, 1):
            write_run(Path(where) / f"alibi/seed={seed}", rows("alibi", seed, {32: 10.0 + seed + (where == "again"),
                                                                           64: 11.0 + seed}))
    with pytest.raises(PosbenchError) as e:
        report(["shipped", "again"], tmp_path / "out")
    assert str(e.value) == ("report: seed 0 of alibi (train_len 32, L=32) is in two runs, shipped/alibi/seed=0 and "
                            "again/alibi/seed=0: pooled, it would count as two seeds and narrow the interval; pass "
                            "each run once, or --by dir to draw the runs under each path given as lines of their own")
    assert not (tmp_path / "out").exists()
    # a seed apart from the other copy's is no duplicate: seed 0 from one folder, seed 1 from the other
    one_each = report(["shipped/alibi/seed=0", "again/alibi/seed=1"], tmp_path / "one").summary
    assert one_each.seeds.tolist() == [2, 2]
    summary = report(["shipped", str(tmp_path / "again")], tmp_path / "out", by=["dir"]).summary
    at32 = summary[summary.eval_len == 32].set_index("label")
    assert sorted(at32.index) == ["alibi [dir=again]", "alibi [dir=shipped]"]  # an absolute path given: relative
    assert at32.seeds.tolist() == [2, 2]
    assert at32.loc["alibi [dir=again]", "ppl_mean"] == pytest.approx(math.sqrt(11 * 12))
    assert at32.loc["alibi [dir=shipped]", "ppl_mean"] == pytest.approx(math.sqrt(10 * 11))
    # beside a config key, in the order given
    proc = posbench("report", "shipped", "again", "--out", tmp_path / "cli", "--by", "train.steps,dir", "--no-reference",
                    cwd=tmp_path)
    assert "| alibi [steps=10, dir=again] |" in proc.stdout


def reference_csv(tmp_path) -> Path:
    path = tmp_path / "paper.csv"
    pd.DataFrame({"encoding": ["alibi", "alibi", "alibi", "sinusoidal", "sinusoidal"],
                  "train_len": 512, "eval_len": [512, 1024, 16384, 512, 1024],
                  "ppl": [20.0, 19.0, 18.5, 20.0, float("nan")], "source": "Paper et al. (table 1)"}).to_csv(path, index=False)
    return path


def test_comparison_figure_lines_interval_marker_and_ratio_panel(sweep, tmp_path):
    """The ratio panel's content and the published panel are tested in test_figures.py; a
    train_len-32 sweep gets no published panel."""
    summary = summarize(collect([sweep]))
    fig = ppl_figure(summary, read_reference(reference_csv(tmp_path)))
    ours, ratio = fig.axes
    lines = {line.get_gid(): line for line in ours.lines}
    assert set(lines) == {"ours:alibi", "ours:alibi sliding/16", "ours:nope", "train_len"}
    assert lines["ours:alibi"].get_xdata().tolist() == [1, 2, 4, 8]  # multiples of train_len
    geometric = [math.sqrt(a * b) for a, b in [(10, 12), (10.5, 12.5), (11, 12), (11.2, 13.2)]]  # of 2 seeds
    assert lines["ours:alibi"].get_ydata().tolist() == pytest.approx(geometric)
    assert lines["ours:alibi sliding/16"].get_linestyle() == ":" and lines["ours:alibi"].get_linestyle() == "-"
    assert lines["train_len"].get_xdata()[0] == 1
    bands = {c.get_gid(): c for c in ours.collections}
    assert list(bands) == ["interval:alibi", "interval:alibi sliding/16", "interval:nope", "interval"]
    (band,) = bands["interval:nope"].get_paths()  # the 95% interval, not min..max (one seed has none)
    nope = summary[summary.label == "nope"].dropna(subset=["ppl_mean"])
    assert band.vertices[:, 1].min() == pytest.approx(nope.ppl_ci_low.min())
    assert band.vertices[:, 1].max() == pytest.approx(nope.ppl_ci_high.max())
    assert [t.get_text() for t in ours.get_legend().get_texts()] == ["alibi", "alibi sliding/16", "nope",
                                                                     INTERVAL_LABEL, "train length"]
    assert {line.get_gid() for line in ratio.lines} == {"ratio:alibi", "ratio:alibi sliding/16", "ratio:nope",
                                                       "ratio_one", "train_len"}
    assert ours.get_xscale() == ratio.get_xscale() == "log" and ours.get_yscale() == "log"  # log y by default
    assert ppl_figure(summary, None, log_y=False).axes[0].get_yscale() == "linear"
    assert len(ppl_figure(summary, None).axes) == 2


def positions_rows(encoding, seed, eval_len, nll, tokens=100, train_len=32):
    edges = [(0, 0), (1, 15), (16, 31), (32, 63)][:len(nll)]
    return pd.DataFrame([{"encoding": encoding, "rope_scaling": "none", "train_len": train_len, "eval_len": eval_len,
                          "seed": seed, "split": "validation", "mode": "nonoverlapping", "stride": eval_len,
                          "bin_start": s, "bin_end": e, "nll": v, "tokens": tokens if s else tokens // 2,
                          "config_hash": "h1", "code_version": "0"} for (s, e), v in zip(edges, nll)])


def test_positions_figure_weights_seeds_by_tokens_at_the_longest_window():
    df = pd.concat([positions_rows("alibi", 0, 64, [6.0, 5.0, 4.0, 4.0], tokens=1000),
                    positions_rows("alibi", 1, 64, [7.0, 6.0, 5.0, 3.0], tokens=3000),
                    positions_rows("alibi", 0, 32, [9.0, 9.0, 9.0], tokens=1000),  # a shorter window: not drawn
                    positions_rows("nope", 0, 32, [6.0, 5.0, 5.5], tokens=1000)], ignore_index=True)
    from posbench.eval.results import with_labels

    fig = positions_figure(with_labels(df))
    (ax,) = fig.axes
    lines = {line.get_gid(): line for line in ax.lines}
    assert lines["positions:alibi"].get_xdata().tolist() == [1, 9, 24.5, 48.5]  # bin midpoints, 1-based
    assert lines["positions:alibi"].get_ydata().tolist() == pytest.approx([6.75, 5.75, 4.75, 3.25])
    assert lines["positions:nope"].get_label() == "nope (L=32)"
    assert lines["train_len"].get_xdata()[0] == 32 and ax.get_xscale() == "log"


def passkey_rows(encoding, seed, correct, scaling="none", status=None):
    """lengths 32, 64, 128 x depths 0, 0.5; 4 trials each."""
    cells = [(n, d) for d in (0.0, 0.5) for n in (32, 64, 128)]
    return pd.DataFrame([{"encoding": encoding, "rope_scaling": scaling, "train_len": 32, "seed": seed, "length": n,
                          "depth": d, "trials": 4, "correct": c, "accuracy": c / 4, "logprob": -1.0,
                          "config_hash": "h1", "code_version": "0", "status": status or "ok"}
                         for (n, d), c in zip(cells, correct)])


def test_passkey_figure_one_heat_map_per_line():
    from posbench.eval.results import with_labels

    learned = passkey_rows("learned", 0, [4, 0, 0, 4, 0, 0])
    learned.loc[learned.length > 32, "status"] = "n/a: past the table"
    df = pd.concat([passkey_rows("rope", 0, [4, 2, 0, 4, 3, 1]), passkey_rows("rope", 1, [4, 4, 1, 2, 3, 0]),
                    passkey_rows("rope", 0, [4, 4, 4, 4, 4, 3], scaling="yarn"), learned], ignore_index=True)
    fig = passkey_figure(with_labels(df))
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["rope", "rope+yarn", "learned"]
    assert len(fig.axes) == 4  # 3 heat maps and the colour bar
    rope = panels[0].images[0]
    assert rope.get_gid() == "passkey:rope"
    assert rope.get_array().tolist() == [[1.0, 0.75, 0.125], [0.75, 0.75, 0.125]]  # (depth, length), 2 seeds
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["32", "64", "128"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["0", "0.5"]
    learned_grid = panels[2].images[0].get_array()
    assert learned_grid[0, 0] == 1.0 and learned_grid.mask[:, 1:].all()  # n/a cells are masked (grey)
    (marker,) = [line for line in panels[0].lines if line.get_gid() == "train_len"]
    assert marker.get_xdata()[0] == 0.5  # after the 32 column


def test_a_line_whose_longest_window_feeds_no_bin_is_drawn_at_the_longest_that_does():
    """One window of 64 tokens feeds every bin once (< 50 windows): the line falls back to 32, and
    a log y axis still has values to scale."""
    from posbench.eval.results import with_labels

    one = positions_rows("rope", 0, 64, [6.0, 5.0, 4.0, 4.0], tokens=2)  # 2 tokens a bin: a single window
    df = pd.concat([one, positions_rows("rope", 0, 32, [7.0, 6.0, 5.0], tokens=1600)], ignore_index=True)
    fig = positions_figure(with_labels(df), log_y=True)
    (line,) = [x for x in fig.axes[0].lines if x.get_gid() == "positions:rope"]
    assert line.get_label() == "rope (L=32)" and line.get_ydata().tolist() == [7.0, 6.0, 5.0]
    assert fig.axes[0].get_yscale() == "log"


def svg_ids(path: Path) -> list[str]:
    return [e.get("id") for e in ET.parse(path).iter() if e.get("id")]


def test_report_writes_tables_figures_and_svg_with_findable_lines(sweep, tmp_path):
    for seed in (0, 1):
        positions_rows("alibi", seed, 64, [6.0, 5.0, 4.0, 4.0], tokens=3200).to_csv(
            sweep / f"alibi/seed={seed}/positions.csv", index=False)
    passkey_rows("nope", 0, [4, 2, 0, 4, 3, 1]).to_csv(sweep / "nope/seed=0/passkey.csv", index=False)
    out = tmp_path / "out"
    done = report([sweep], out, fmt="latex", reference=reference_csv(tmp_path))
    names = sorted(p.name for p in out.iterdir())
    assert names == ["context.csv", "context.png", "context.svg",  # alibi's sliding rows past its train_len
                     "passkey.png", "passkey.svg", "positions.png", "positions.svg", "probes.csv", "report.csv",
                     "report.html", "report.md", "report.png", "report.svg", "report.tex"]
    assert sorted(p.name for p in done.files) == names
    assert done.table.startswith(r"\begin{table}") and (out / "report.tex").read_text() == done.table + "\n"
    md = (out / "report.md").read_text()
    assert "| alibi sliding/16 | 32 | 2 | **9.25 ± 0.35 [" in md and "![positions](positions.png)" in md
    # two seeds whose ratios differ, beside a line whose seeds differ more at L=64: with two seeds a
    # line takes at least the column's pooled seed variance, which leaves L=64 undecided
    assert ("- alibi: ppl(L=256) / ppl(L=32) = 1.110 [0.994, 1.239]; within 10% of ppl(L=32) up to L=32 (1x); "
            "L=64: not distinguishable from 10%\n") in md
    assert "Cells: geometric mean ± std over seeds [95% interval" in md
    tidy = pd.read_csv(out / "report.csv")
    assert len(tidy) == 4 + 2 + 4 and set(tidy.label) == {"alibi", "alibi sliding/16", "nope"}
    assert tidy.set_index(["label", "eval_len"]).loc[("alibi", 32), "word_ppl_mean"] == 22.0

    ids = svg_ids(out / "report.svg")
    for gid in ("ours:alibi", "ours:alibi sliding/16", "ours:nope", "interval:alibi", "ratio:alibi",
                "ratio_interval:alibi", "ratio_one", "train_len", "setup"):
        assert gid in ids, gid
    assert not any(i.startswith("paper:") for i in ids)  # train_len 32: no published panel, and report.md says why
    assert "The published panel (Paper et al. (table 1), train_len 512) is left out" in md
    texts = {t.text for t in ET.parse(out / "report.svg").iter("{http://www.w3.org/2000/svg}text")}
    assert {"alibi sliding/16", "train length", "evaluation length / train length"} <= texts
    assert "positions:alibi" in svg_ids(out / "positions.svg") and "passkey:nope" in svg_ids(out / "passkey.svg")
    expected = ppl_figure(done.summary, read_reference(reference_csv(tmp_path))).get_size_inches() * DPI
    png = matplotlib.image.imread(out / "report.png")
    assert png.shape[:2] == (round(expected[1]), round(expected[0])) and png[..., :3].std() > 0.05


def test_cli_report_options_and_errors(sweep, tmp_path):
    proc = posbench("report", sweep, "--format", "latex", "--log-y", "--no-reference")
    assert r"\toprule" in proc.stdout and "nope: ppl(L=256) / ppl(L=32) = n/a" in proc.stdout
    assert (sweep / "report.tex").exists() and not any(i.startswith("paper:") for i in svg_ids(sweep / "report.svg"))
    bad = posbench("report", sweep, "--reference", tmp_path / "missing.csv", check=False)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        f"posbench: error: report: --reference '{tmp_path / 'missing.csv'}' does not exist; pass a CSV with "
        "columns encoding, train_len, eval_len, ppl, or --no-reference")
    pd.DataFrame({"encoding": ["alibi"], "length": [512]}).to_csv(tmp_path / "ref.csv", index=False)
    bad = posbench("report", sweep, "--reference", tmp_path / "ref.csv", check=False)
    assert bad.returncode == 2 and "lacks column(s) train_len, eval_len, ppl" in bad.stderr


def test_packaged_reference_is_the_alibi_paper_table():
    ref = read_reference(REFERENCE)
    assert sorted(ref.encoding.unique()) == ["alibi", "rope", "sinusoidal", "t5"] and (ref.train_len == 512).all()


def test_scripts_read_only_plain_nonoverlapping_lines(sweep, tmp_path):
    report([sweep], tmp_path / "out")
    tidy = pd.read_csv(tmp_path / "out/report.csv")
    tidy.iloc[::-1].to_csv(tmp_path / "reversed.csv", index=False)  # row order is no contract
    table = subprocess.run([sys.executable, "-m", "posbench.report.encoding_table", tmp_path / "reversed.csv"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["`alibi`", "`nope`"]
    assert table[2].endswith("| 11.0 | 12.2 | 1.110 [0.994, 1.239] | not distinguishable (yes/partly) |")  # not sliding's
    # a variant beside its default, both runs also scored with sliding windows
    sliding = {32: 5.0, 64: 5.0, 128: 5.0, 256: 5.0}
    write_run(tmp_path / "zoo/alibi", rows("alibi", 0, {32: 10.0, 64: 10.5, 128: 11.0, 256: 11.2}),
              rows("alibi", 0, sliding, mode="sliding", stride=16), encoding={"form": "causal"})
    write_run(tmp_path / "variants/alibi", rows("alibi", 0, {32: 10.1, 64: 10.6, 128: 11.1, 256: 11.3}, chash="h2"),
              rows("alibi", 0, sliding, mode="sliding", stride=16, chash="h2"), encoding={"form": "symmetric"})
    table = subprocess.run([sys.executable, ROOT / "scripts/variant_table.py", tmp_path / "zoo", tmp_path / "variants"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert table[0] == "| encoding | variant | seeds | L=32 | L=64 | L=128 | L=256 | ppl(16x) / ppl(1x) |"
    assert [line.split(" | ")[:3] for line in table[2:]] == [["| alibi", "default", "1"],
                                                           ["| alibi", "form=symmetric", "1"]]
    for line, mean in zip(table[2:], (10.0, 10.1)):  # one seed: the interval of the token bootstrap, around the ppl
        low, high = map(float, re.match(rf"{mean} \[(\d+\.\d), (\d+\.\d)\]$", line.split(" | ")[3]).groups())
        assert low < mean < high
    assert all(line.endswith("| n/a |") and " 11.2 [" in table[2] for line in table[2:])  # no 16x here
    write_run(tmp_path / "variants/alibi1", rows("alibi", 1, {32: 10.3, 64: 10.8, 128: 11.3, 256: 11.5}, chash="h2"),
              encoding={"form": "symmetric"})
    table = subprocess.run([sys.executable, ROOT / "scripts/variant_table.py", tmp_path / "zoo", tmp_path / "variants"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert table[3].startswith("| alibi | form=symmetric | 2 | 10.2 ± 0.1 [")  # seeds averaged


@pytest.mark.slow
def test_report_on_a_real_training_run(tmp_path):
    run = tmp_path / "run"
    posbench("train", *SMOKE, "encoding=rope", "train.steps=10", f"hydra.run.dir={run}")
    proc = posbench("report", run, "--out", tmp_path / "out")
    results = read_results(run / "results.csv")
    tidy = pd.read_csv(tmp_path / "out/report.csv")
    plain = tidy[tidy.label == "rope"].set_index("eval_len").ppl_mean
    assert plain.to_dict() == pytest.approx(results[results["mode"] == "nonoverlapping"].set_index("eval_len").ppl.to_dict())
    assert "| rope | 32 | 1 |" in proc.stdout and "rope: no extrapolation verdict: its ppl at train_len" in proc.stdout
    ids = svg_ids(tmp_path / "out/report.svg")
    assert "ratio:rope" in ids and "paper:rope" not in ids  # a train_len-32 smoke run gets no published panel
    assert "training:rope" in svg_ids(tmp_path / "out/training.svg")  # from the run's metrics.jsonl
    for name in ("positions", "passkey"):  # drawn exactly when evaluation wrote the table
        assert (tmp_path / f"out/{name}.png").exists() == (run / f"{name}.csv").exists()


def test_sliding_lines_name_their_stride(tmp_path):
    df = pd.concat([rows("alibi", 0, {32: 9.0, 64: 9.5}, mode="sliding", stride=16),
                    rows("rope", 0, {32: 9.0, 64: 9.5, 128: 9.7}, mode="sliding"),  # stride = eval_len
                    rows("t5", 0, {32: 9.0}, mode="sliding", stride=16), rows("t5", 0, {64: 9.0}, mode="sliding", stride=20)],
                   ignore_index=True)
    rope = df.encoding == "rope"
    df.loc[rope, "stride"] = df.loc[rope, "eval_len"] // 2  # eval.stride=null: half the window
    df.loc[rope, "rope_scaling"] = "yarn"
    summary = summarize(df)
    assert summary.label.tolist() == ["alibi sliding/16"] * 2 + ["rope+yarn sliding/L/2"] * 3 + \
        ["t5 sliding/16", "t5 sliding/20"]
    assert summary[summary.label == "rope+yarn sliding/L/2"].stride.tolist() == [16, 32, 64]


def test_a_config_difference_names_the_key_a_user_sets_first(tmp_path):
    """Runs at two budgets under warmup-stable-decay differ in train.steps and in the decay_frac and
    warmup a preset derives from it: --by is advised for train.steps, not the first key by name."""
    from omegaconf import OmegaConf

    from posbench.report.collect import config_diff

    for name, steps, frac in (("a", 400, 0.2), ("b", 800, 0.1)):
        (tmp_path / name).mkdir()
        config = {"train": {"steps": steps, "decay_frac": frac, "schedule": "wsd"}}
        OmegaConf.save(config, tmp_path / name / "config.yaml")
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert config_diff(runs, ["h1", "h2"]).startswith(f"train.steps (400 in {runs[0]}, 800 in {runs[1]}), "
                                                      "train.decay_frac (0.2 in")
