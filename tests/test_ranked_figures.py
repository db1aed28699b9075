"""Reports of many lines stay readable: past eight lines, one point per line (ranked.png: the ratio
and the ppl at 1x with their intervals, grouped by family and sorted; tradeoff.png: one labelled
point per line, no two labels overlapping), and the per-line figures for the lines named with
--lines or picked by the report (best, worst, baselines); no loss-by-position figure from fewer
windows than it needs, and report.md says why."""

import math
import re

import pandas as pd
import pytest
from conftest import posbench
from test_report import positions_rows, rows, svg_ids, write_run

from posbench.errors import PosbenchError
from posbench.report.figures import MIN_BIN_WINDOWS, Palette
from posbench.report.ranked import (
    common_multiple,
    family,
    label_points,
    line_points,
    pick_lines,
    picked_text,
    ranked_figure,
    split_names,
    tradeoff_figure,
)
from posbench.report.build import report

LENGTHS = (32, 64, 128, 256, 512)  # 1x .. 16x
# encoding -> (ppl at 1x, ratio at 16x); learned cannot run past its table
ZOO = {"alibi": (10.0, 0.98), "kerple_log": (10.2, 0.99), "fire": (10.4, 1.15), "t5": (10.6, 1.0),
       "rope": (9.9, 1.4), "xpos": (10.1, 1.06), "nope": (12.0, 1.07), "sinusoidal": (11.0, 2.9),
       "cope": (10.5, 1.10), "complex": (13.0, 11.5), "learned": (12.5, math.nan)}


def zoo(tmp_path, encodings=ZOO):
    """One run per encoding, its ppl rising geometrically from 1x to its ratio at 16x."""
    for i, (encoding, (ppl, ratio)) in enumerate(encodings.items()):
        ppls = {n: ppl if n == 32 else ppl * ratio ** (math.log2(n / 32) / 4) for n in LENGTHS}
        write_run(tmp_path / "runs" / encoding, rows(encoding, 0, ppls, chash=f"h{i}"))
    return tmp_path / "runs"


def test_family_is_the_encodings_hook_or_its_name_prefix():
    assert [family(e) for e in ("alibi", "rope", "nope", "sinusoidal", "xl", "fox")] == \
        ["bias", "rotate", "none", "embed", "score", "decay"]
    assert family("my_plugin_bias") == "my"  # not registered: grouped by the prefix of its name


def test_lines_split_at_commas_outside_brackets():
    assert split_names(["alibi,rope [window=128]", "rope [qk_norm=True, window=0] , t5"]) == \
        ["alibi", "rope [window=128]", "rope [qk_norm=True, window=0]", "t5"]


def test_a_report_of_many_lines_ranks_every_line_and_draws_the_picked_ones(tmp_path):
    out = tmp_path / "out"
    done = report([zoo(tmp_path)], out, reference=None)
    assert {"ranked.png", "ranked.svg", "tradeoff.png", "tradeoff.svg", "report.png"} <= {p.name for p in done.files}
    summary = done.summary
    at16 = summary[summary.eval_len == 512].set_index("label")

    # ranked: every line, its ratio at 16x and its ppl at 1x, grouped by hook, sorted by ratio within
    ids = svg_ids(out / "ranked.svg")
    assert {f"ranked_ratio:{e}" for e in ZOO} <= set(ids) and {f"ranked_ppl:{e}" for e in ZOO} <= set(ids)
    points = line_points(summary, Palette(summary).names(summary))
    fig = ranked_figure(points)
    left, right = fig.axes
    dots = {line.get_gid(): line for line in left.lines if line.get_marker() == "o"}
    assert dots["ranked_ratio:rope"].get_xdata()[0] == pytest.approx(at16.loc["rope", "ratio_mean"])
    dots = {line.get_gid(): line for line in right.lines if line.get_marker() == "o"}
    assert dots["ranked_ppl:nope"].get_xdata()[0] == pytest.approx(
        summary.set_index(["label", "eval_len"]).loc[("nope", 32), "ppl_mean"])
    labels = [t.get_text() for t in left.get_yticklabels()]
    bias = labels[labels.index("additive bias (bias)") + 1:labels.index("additive bias (bias)") + 5]
    assert bias == ["alibi", "kerple_log", "t5", "fire"]  # the bias family, by ratio
    assert labels.index("rotary (rotate)") < labels.index("xpos") < labels.index("rope")
    assert "learned" in labels and any("cannot run at 16x" in t.get_text() for t in left.texts)

    # tradeoff: one labelled point per line that runs at 16x, no two labels overlapping
    fig = tradeoff_figure(points)
    texts = [t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("tradeoff_label:")]
    assert sorted(t.get_text() for t in texts) == sorted(e for e in ZOO if e != "learned")
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert "cannot run at 16x: learned" in fig._suptitle.get_text().replace("\n", " ")

    # report.png: the picked lines only, each in a colour of its own; report.md says which and why
    picked = pick_lines(points)
    assert picked == {"alibi": "lowest ppl at 16x, lowest ratio at 16x", "complex": "highest ratio at 16x",
                      "nope": "baseline", "rope": "baseline", "sinusoidal": "baseline", "t5": "baseline"}
    drawn = {i.split(":", 1)[1] for i in svg_ids(out / "report.svg") if i.startswith("ours:")}
    assert drawn == set(picked)
    palette = Palette(summary, only=list(picked))
    assert len({palette.colour(name) for name in picked}) == len(picked)
    md = (out / "report.md").read_text()
    assert "![ranked](ranked.png)" in md and "![tradeoff](tradeoff.png)" in md
    assert ("report.png (and the per-line figures below it) draws 6 of the 11 lines, picked by the report: alibi "
            "(lowest ppl at 16x, lowest ratio at 16x); complex (highest ratio at 16x); nope (baseline);") in md
    # the table keeps every line
    assert set(pd.read_csv(out / "report.csv").label) == set(ZOO)


def test_lines_names_what_the_per_line_figures_draw_and_an_unknown_line_is_refused(tmp_path):
    runs = zoo(tmp_path)
    report([runs], tmp_path / "out", reference=None, lines=["fire,cope"])
    drawn = {i.split(":", 1)[1] for i in svg_ids(tmp_path / "out/report.svg") if i.startswith("ours:")}
    assert drawn == {"fire", "cope"}
    assert "draws 2 of the 11 lines, named with --lines: cope, fire." in (tmp_path / "out/report.md").read_text()
    few = zoo(tmp_path / "few", {e: ZOO[e] for e in ("alibi", "rope", "nope")})
    done = report([few], tmp_path / "few_out", reference=None, lines=["rope"])  # a small report: no ranked figure
    assert "ranked.png" not in {p.name for p in done.files}
    assert {i for i in svg_ids(tmp_path / "few_out/report.svg") if i.startswith("ours:")} == {"ours:rope"}
    with pytest.raises(PosbenchError, match=r"^report: --lines 'nosuch' is not a line of this report; valid: alibi, "):
        report([runs], tmp_path / "bad", lines=["nosuch"])
    proc = posbench("report", runs, "--out", tmp_path / "cli", "--lines", "alibi,nosuch", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "cli").exists()
    assert "--lines 'nosuch' is not a line of this report" in proc.stderr


def test_no_positions_figure_from_fewer_windows_than_it_needs(tmp_path):
    """16 windows a bin (zoo_quick at 16x): no figure, and report.md says why; 64: drawn."""
    for windows, name in ((16, "thin"), (64, "enough")):
        run = write_run(tmp_path / name / "alibi", rows("alibi", 0, {32: 10.0, 64: 10.2}))
        bins = positions_rows("alibi", 0, 64, [6.0, 5.0, 4.0, 4.0])
        bins["tokens"] = windows * (bins.bin_end - bins.bin_start + 1)  # every bin fed by `windows` windows
        bins.to_csv(run / "positions.csv", index=False)
        done = report([tmp_path / name], tmp_path / f"{name}_out", reference=None)
        drawn = (tmp_path / f"{name}_out/positions.png").exists()
        md = (tmp_path / f"{name}_out/report.md").read_text()
        assert drawn == (windows >= MIN_BIN_WINDOWS) and drawn == ("![positions]" in md), name
        said = re.search(r"No loss-by-position figure \(positions.png\): .*? feed at most (\d+) ", md)
        assert (said is None) == drawn and (drawn or said[1] == "16")
        assert done.summary.ppl_mean.notna().all()


def test_labels_keep_apart_in_a_tight_cluster():
    """Twenty points within 1% of each other: every label beside its point or led to it by a line,
    none overlapping another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = pd.DataFrame({"ppl": [90 + 0.1 * i for i in range(20)], "ratio": [0.98 + 0.0005 * (i % 7) for i in range(20)],
                           "short": [f"line_{i}" for i in range(20)], "name": [f"line_{i}" for i in range(20)]})
    fig, ax = plt.subplots(figsize=(7, 6))
    ax.plot(points.ppl, points.ratio, "o")
    label_points(ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 20 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_a_line_at_one_length_does_not_narrow_the_ranked_multiple():
    """common_multiple: the longest multiple every line with a ratio has; a line at one length only
    (LongPPL's sliding row), or at several none of which is train_len (two short contexts' sliding
    rows as one line), is left out of the choice, unless every line is such a line."""

    summary = pd.DataFrame({"eval_len": [16, 32, 64, 128, 16, 32, 64, 128, 4, 8, 16], "train_len": [32] * 11})
    names = pd.Series(["a"] * 4 + ["b"] * 4 + ["sliding"] + ["sliding2"] * 2)
    assert common_multiple(summary.iloc[:9], names.iloc[:9]) == 4.0
    assert common_multiple(summary, names) == 4.0  # sliding2 has 0.25x and 0.5x, no 1x: no ratio
    assert common_multiple(summary.iloc[:7], names.iloc[:7]) == 2.0
    assert common_multiple(summary.iloc[[8]], names.iloc[[8]]) == 0.125
    assert common_multiple(summary.iloc[9:], names.iloc[9:]) == 0.5  # no line with a ratio: the longest shared


def test_baselines_are_found_by_encoding_in_the_setup_of_the_best_line():
    """A budget study: every label carries its steps, so none equals its encoding; the baselines
    are still drawn, each the line of its encoding at the budget of the lowest ppl at 16x."""
    rows = []
    for steps, ppl in ((1221, 60.0), (4883, 47.0)):
        for enc, ratio in (("alibi", 0.97), ("nope", 8.0), ("rope", 5.0), ("sinusoidal", 11.0), ("t5", 1.0),
                           ("fire", 1.2)):
            rows.append({"name": f"{enc} [steps={steps}]", "short": f"{enc} [steps={steps}]", "encoding": enc,
                         "setup": f" [steps={steps}]",
                         "multiple": 16.0, "ratio": ratio + (steps < 4883) / 100,
                         "ppl_at": ppl * ratio + (enc == "fire"),
                         "ppl": ppl + (enc != "alibi")})
    points = pd.DataFrame(rows)
    picked = pick_lines(points)
    assert picked == {"alibi [steps=4883]": "lowest ppl at 16x, lowest ratio at 16x",
                      "nope [steps=4883]": "baseline", "rope [steps=4883]": "baseline",
                      "sinusoidal [steps=1221]": "highest ratio at 16x", "sinusoidal [steps=4883]": "baseline",
                      "t5 [steps=4883]": "baseline"}
    # a zoo's plain names (one with a train_len note) keep their plain baselines
    zoo = pd.DataFrame({"name": ["alibi", "rope (train_len=64)", "rope [window=64]", "fire"],
                        "short": ["alibi", "rope (train_len=64)", "rope [window=64]", "fire"],
                        "encoding": ["alibi", "rope", "rope", "fire"], "setup": ["", "", " [window=64]", ""],
                        "multiple": 16.0,
                        "ratio": [1.0, 4.0, 1.1, 1.2], "ppl_at": [10.0, 40.0, 11.0, 9.0]})
    assert pick_lines(zoo) == {"alibi": "lowest ratio at 16x", "rope (train_len=64)": "highest ratio at 16x",
                               "fire": "lowest ppl at 16x"}
    # the best line has a setup, the baselines a plain line: the plain lines
    zoo.loc[2, "ppl_at"] = 1.0
    assert pick_lines(zoo)["rope (train_len=64)"] == "highest ratio at 16x"
    assert pick_lines(zoo)["alibi"] == "lowest ratio at 16x"
    zoo.loc[0, "ratio"] = 1.15
    assert pick_lines(zoo)["alibi"] == "baseline"


def test_the_picked_lines_text_says_what_their_short_names_leave_out():
    """Lines named by folder (``--by dir``): the legends drop the folder most lines share and name it
    once in their title; report.md's line under report.png names the same lines, so it says so too."""
    names = ["alibi [dir=gpu]", "alibi [dir=cpu]", "rope [dir=cpu]"]
    points = pd.DataFrame({"name": names, "short": ["alibi [dir=gpu]", "alibi", "rope"], "unless": "dir=cpu"})
    text = picked_text({"alibi [dir=cpu]": "baseline", "alibi [dir=gpu]": "lowest ratio at 16x"}, points, False)
    assert text.startswith("report.png (and the per-line figures below it) draws 2 of the 3 lines (named as the "
                           "legends name them; unless shown: dir=cpu), picked by the report: alibi (baseline); "
                           "alibi [dir=gpu] (lowest ratio at 16x).")
    plain = pd.DataFrame({"name": ["alibi", "rope"], "short": ["alibi", "rope"], "unless": ""})
    assert "draws 1 of the 2 lines, named with --lines: rope." in picked_text({"rope": "x"}, plain, True)


def test_many_lines_without_a_shared_length_report_without_the_per_line_figures(tmp_path):
    """Nine lines, four evaluated at 32 tokens only and five at 64 only: no multiple is common to
    them, so no line has a ratio to place; the report is written without ranked.png and
    tradeoff.png (it stopped at the tradeoff figure's NaN axis limits)."""
    for i, encoding in enumerate(list(ZOO)[:9]):
        write_run(tmp_path / "runs" / encoding, rows(encoding, 0, {32 if i < 4 else 64: 10.0 + i}, chash=f"h{i}"))
    done = report([tmp_path / "runs"], tmp_path / "out", reference=None)
    md = (tmp_path / "out" / "report.md").read_text()
    assert done.summary.ppl_mean.notna().all() and "![ranked]" not in md and "![tradeoff]" not in md
    assert not (tmp_path / "out" / "ranked.png").exists() and not (tmp_path / "out" / "tradeoff.png").exists()
