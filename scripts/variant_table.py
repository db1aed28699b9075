"""Variant comparison table: each run's encoding options against conf/encoding/<name>.yaml.

    python scripts/variant_table.py outputs/zoo_quick outputs/variants > results/variants/variants.md

Runs are told apart by the options in the config.yaml beside each results.csv that differ
from the encoding's YAML defaults ("default" when none differ); only encodings with at
least one non-default run are listed, so each variant sits next to its default.
"""

import sys
from pathlib import Path

from omegaconf import OmegaConf

from posbench.config import conf_dir
from posbench.results import read_results


def variant(encoding: dict) -> str:
    defaults = OmegaConf.to_container(OmegaConf.load(conf_dir() / "encoding" / f"{encoding['name']}.yaml"))
    changed = [f"{k}={v}" for k, v in encoding.items()
               if k != "name" and not str(defaults.get(k, "")).startswith("${") and defaults.get(k, v) != v]
    return ", ".join(changed) or "default"


def main(dirs: list[str]) -> None:
    rows = []
    for path in dirs:
        for results in sorted(Path(path).rglob("results.csv")):
            cfg = OmegaConf.load(results.parent / "config.yaml")
            df = read_results(results)
            df = df[(df.rope_scaling == "none") & (df["mode"] == "nonoverlapping")]  # unscaled, non-overlapping
            rows.append((cfg.encoding.name, variant(OmegaConf.to_container(cfg.encoding)),
                         dict(zip(df.eval_len, df.ppl)), int(cfg.train.train_len)))
    varied = {enc for enc, var, _, _ in rows if var != "default"}
    lengths = sorted({n for _, _, ppl, _ in rows for n in ppl})
    lines = ["| encoding | variant | " + " | ".join(f"L={n}" for n in lengths) + " | ppl(16x) / ppl(1x) |",
             "|---|---|" + "---|" * (len(lengths) + 1)]
    for enc, var, ppl, tlen in sorted(r for r in rows if r[0] in varied):
        cells = " | ".join("n/a" if ppl.get(n) != ppl.get(n) else f"{ppl[n]:.1f}" for n in lengths)
        ratio = ppl.get(16 * tlen, float("nan")) / ppl.get(tlen, float("nan"))
        lines.append(f"| {enc} | {var} | {cells} | {'n/a' if ratio != ratio else f'{ratio:.2f}'} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
