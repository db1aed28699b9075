"""Variant comparison table: each run's encoding options against conf/encoding/<name>.yaml.

    python scripts/variant_table.py outputs/zoo_quick outputs/variants > results/variants/variants.md

Runs are told apart by the options in the config.yaml beside each results.csv that differ
from the encoding's YAML defaults ("default" when none differ); only encodings with at
least one non-default run are listed, so each variant sits next to its default. Seeds of the
same variant are averaged as `posbench report` averages them, with the same 95% intervals:
each cell is 'mean ± std [interval]' of the perplexity, and the last column is the line's
ppl(16x) / ppl(1x) with its paired interval. Only unscaled, non-overlapping rows are read.
"""

import sys
from pathlib import Path

from omegaconf import OmegaConf

from posbench.config import conf_dir
from posbench.report.collect import collect
from posbench.report.summary import summarize


def variant(encoding: dict) -> str:
    defaults = OmegaConf.to_container(OmegaConf.load(conf_dir() / "encoding" / f"{encoding['name']}.yaml"))
    changed = [f"{k}={v}" for k, v in encoding.items()
               if k != "name" and not str(defaults.get(k, "")).startswith("${") and defaults.get(k, v) != v]
    return ", ".join(changed) or "default"


def run_variant(run: str) -> str:
    return variant(OmegaConf.to_container(OmegaConf.load(Path(run) / "config.yaml").encoding))


def cell(mean: float, std: float, low: float, high: float) -> str:
    if mean != mean:
        return "n/a"
    spread = "" if std != std else f" ± {std:.1f}"
    interval = "" if low != low else f" [{low:.1f}, {high:.1f}]"
    return f"{mean:.1f}{spread}{interval}"


def ratio(row) -> str:
    if row is None or row.ratio_mean != row.ratio_mean:
        return "n/a"
    interval = "" if row.ratio_ci_low != row.ratio_ci_low else f" [{row.ratio_ci_low:.3f}, {row.ratio_ci_high:.3f}]"
    return f"{row.ratio_mean:.3f}{interval}"


def table(dirs: list[str]) -> str:
    df = collect(dirs)
    df = df[(df.rope_scaling == "none") & (df["mode"] == "nonoverlapping")]
    df = df.assign(variant=df.run.map(run_variant))
    varied = set(df.encoding[df.variant != "default"])
    summary = summarize(df[df.encoding.isin(varied)])
    lengths = sorted(summary.eval_len.unique())
    lines = ["| encoding | variant | seeds | " + " | ".join(f"L={n}" for n in lengths) + " | ppl(16x) / ppl(1x) |",
             "|---|---|---|" + "---|" * (len(lengths) + 1)]
    for (enc, var, tlen), g in summary.groupby(["encoding", "variant", "train_len"]):
        at = {r.eval_len: r for r in g.itertuples()}
        cells = [cell(at[n].ppl_mean, at[n].ppl_std, at[n].ppl_ci_low, at[n].ppl_ci_high) if n in at else ""
                 for n in lengths]
        lines.append(f"| {enc} | {var} | {int(g.seeds.max())} | " + " | ".join(cells)
                     + f" | {ratio(at.get(16 * tlen))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1:]))
