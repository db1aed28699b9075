"""``posbench convert RUN --pairing P --out DIR``: a rotary run for the other RoPE pairing
(:mod:`posbench.convert` does the work)."""

from __future__ import annotations

import argparse

HELP = "rewrite a rotary run for the other RoPE pairing (half <-> interleaved); same perplexities"


def main(args: list[str]) -> None:
    from ..convert import PAIRINGS, convert_run

    parser = argparse.ArgumentParser(prog="posbench convert", description=HELP)
    parser.add_argument("run", help="a run dir made by `posbench train` with encoding rope or xpos")
    parser.add_argument("--pairing", required=True, choices=PAIRINGS, help="the RoPE pairing to convert to")
    parser.add_argument("--out", required=True, help="the new run dir (config.yaml, checkpoints/last.pt)")
    ns = parser.parse_args(args)
    out = convert_run(ns.run, ns.pairing, ns.out)
    print(f"wrote {out} (encoding.pairing={ns.pairing}); evaluate it with: posbench eval checkpoint={out}")
