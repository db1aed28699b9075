"""``posbench longppl --evaluator DIR RUNS...``: LongPPL of every row of the runs under RUNS on the key
tokens of one evaluator (:mod:`posbench.eval.longppl` does the work), written to longppl.csv."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "perplexity over an evaluator's key tokens, those it predicts only with a long context (LongPPL)"


def check_options(ns) -> None:
    """One line for a length that is not positive or a threshold that is not a finite number,
    before any run is read."""
    import math

    from ..errors import PosbenchError

    for flag, value in (("--short", ns.short), ("--short-stride", ns.short_stride), ("--long", ns.long)):
        if value is not None and value < 1:
            raise PosbenchError(f"longppl: {flag} {value} is not valid; valid: a length in tokens >= 1")
    for flag, value in (("--alpha", ns.alpha), ("--beta", ns.beta)):
        if not math.isfinite(value):
            raise PosbenchError(f"longppl: {flag} {value} is not valid; valid: a finite number (nats)")


def main(args: list[str]) -> None:
    from ..eval.longppl import ALPHA, BETA, FILE, SHORT_STRIDE_DIVISOR, study_longppl
    from ..eval.results import RESULTS, find_files
    from ..runs.rundir import atomic_write_text

    parser = argparse.ArgumentParser(prog="posbench longppl", description=HELP)
    parser.add_argument("runs", nargs="+", help="run dirs, sweep dirs or pretrained output dirs (results.csv and "
                                                "token_nll.npz inside)")
    parser.add_argument("--evaluator", required=True, metavar="DIR",
                        help="the run dir or pretrained output dir whose long and short rows choose the key tokens")
    parser.add_argument("--short", type=int, default=None, metavar="LEN",
                        help="eval_len of the evaluator's sliding row (default: the runs' smallest train_len)")
    parser.add_argument("--short-stride", type=int, default=None, metavar="S",
                        help=f"its stride (default: LEN // {SHORT_STRIDE_DIVISOR})")
    parser.add_argument("--long", type=int, default=None, metavar="LEN",
                        help="eval_len of the evaluator's non-overlapping row (default: its longest at most its "
                             "trained context)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"LSD threshold in nats (default {ALPHA})")
    parser.add_argument("--beta", type=float, default=BETA, help=f"LCL threshold, a log-probability (default {BETA})")
    parser.add_argument("--split", default="validation", choices=["validation", "test"],
                        help="the rows' split (default validation)")
    parser.add_argument("--out", default=FILE, help=f"the CSV written (default ./{FILE})")
    ns = parser.parse_args(args)
    check_options(ns)
    runs = [f.parent for f in find_files(ns.runs, RESULTS)]
    table = study_longppl(ns.evaluator, runs, ns.short, ns.short_stride, ns.long, ns.split, ns.alpha, ns.beta)
    atomic_write_text(Path(ns.out), table.to_csv(index=False))
    first = table.iloc[0] if len(table) else None
    if first is not None:
        print(f"key tokens: {first.key_tokens} of {first.tokens} (evaluator {first.evaluator}: long {first.long_len}, "
              f"short {first.short_len}/{first.short_stride}, alpha {first.alpha}, beta {first.beta})")
    for row in table.itertuples():
        print(f"{row.model} {row.encoding} {row.rope_scaling} train_len={row.train_len} seed={row.seed} "
              f"{row.mode}/{row.stride} eval_len={row.eval_len}: longppl {row.longppl:.3f} ppl {row.ppl:.3f}")
    print(f"wrote {ns.out} ({len(table)} rows)")
