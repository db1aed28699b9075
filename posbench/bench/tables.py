"""bench.md: the tables of a run's rows, and the targets the rows are held to."""

from __future__ import annotations

import math

from .children import MATMUL_N, PEER_ENCODINGS, flops_per_token, is_peer, mfu, model_shape, split_entry
from .run import MALLOCS, measured


def _short(error) -> str:
    """A table cell for a failed measurement (the CSV keeps the whole message)."""
    error = str(error)
    if "memory" in error.lower():
        return "out of memory"
    return error.split(": ", 1)[-1][:60]


def _fmt(value, spec=",.0f"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


def _pick(df, enc, malloc, kind, length, peer: bool):
    """posbench's row, or the faster x-transformers row (attn_flash on or off), or None."""
    rows = df[(df.encoding == enc) & (df.malloc == malloc) & (df.kind == kind) & (df.length == length)
              & (df.impl.map(is_peer) if peer else (df.impl == "posbench"))]
    fast = rows[rows.tokens_per_s.notna()]
    if len(fast):
        return fast.loc[fast.tokens_per_s.idxmax()]
    return rows.iloc[0] if len(rows) else None


def _tps(row):
    return None if row is None or row.tokens_per_s is None or row.tokens_per_s != row.tokens_per_s else row.tokens_per_s


def _cell_text(row, value):
    """A figure, or the row's shortened error, or '-' when nothing was measured."""
    if row is None:
        return "-"
    return _fmt(value) if _tps(row) else _short(row.error)


def _params(df, enc, impl_is_peer: bool) -> str:
    rows = df[(df.encoding == enc) & (df.impl.map(is_peer) if impl_is_peer else (df.impl == "posbench"))]
    counts = rows.params.dropna()
    return f"{counts.iloc[0] / 1e6:.2f}M" if len(counts) else "-"


def _model_table(df, kind: str, peak_gflops: float, shape: dict | None = None) -> list[str]:
    """One line per (encoding, malloc): per length, posbench and x-transformers under that same
    allocator setting and their ratio (training: and posbench's FLOP/s as a fraction of the peak;
    evaluation: and both peak memories)."""
    lengths = sorted(set(df[df.kind == kind].length))
    if not lengths:
        return []
    per = (("tok/s", "x-t", "ratio", "FLOP/s of peak") if kind == "train"
           else ("tok/s", "MB", "x-t tok/s", "x-t MB", "ratio"))
    head = ["encoding", "malloc", "params", "x-t params"] + [f"{x} {'T=' if kind == 'train' else ''}{n}"
                                                             for n in lengths for x in per]
    counts = ", ".join(f"{int(n):,}" for n in sorted(set(df[df.kind == kind].tokens)))
    out = [f"### {'Training' if kind == 'train' else 'Evaluation'}", "",
           f"{counts} tokens {'a step' if kind == 'train' else 'a pass'}.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for enc in _encodings(df):
        for malloc in [m for m in MALLOCS if m in set(df.malloc)]:
            cells = [enc, malloc, _params(df, enc, False), _params(df, enc, True)]
            for n in lengths:
                ours, theirs = _pick(df, enc, malloc, kind, n, False), _pick(df, enc, malloc, kind, n, True)
                ratio = f"{_tps(ours) / _tps(theirs):.2f}" if _tps(ours) and _tps(theirs) else "-"
                if kind == "train":
                    frac = f"{_tps(ours) * flops_per_token(n, shape) / (peak_gflops * 1e9):.0%}" if _tps(ours) else "-"
                    cells += [_cell_text(ours, _tps(ours)), _cell_text(theirs, _tps(theirs)), ratio, frac]
                else:
                    cells += [_cell_text(ours, _tps(ours)), _fmt(None if ours is None else ours.peak_mb),
                              _cell_text(theirs, _tps(theirs)), _fmt(None if theirs is None else theirs.peak_mb), ratio]
            out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _encodings(df, asked: bool = False) -> list[str]:
    """The encodings of ``df``'s rows, sorted, or in the order they were asked for (``asked``)."""
    return list(dict.fromkeys(df.encoding)) if asked else sorted(set(df.encoding))


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _gpu_table(df, machine: dict, shape: dict, length: int, malloc: str) -> list[str]:
    """Training on a GPU at ``length``: per encoding, posbench's and x-transformers' tokens/s, MFU
    against the datasheet peak, fraction of the measured matmul peak, peak memory and compile
    time, and the ratio of their tokens/s."""
    datasheet, measured_peak = machine.get("datasheet_bf16_tflops"), machine.get("bfloat16_gflops", math.nan) / 1e3
    head = ["encoding", "params", "tok/s", "MFU", "of matmul peak", "peak GB", "compile s",
            "x-t tok/s", "x-t MFU", "x-t of matmul peak", "x-t peak GB", "x-t compile s", "posbench / x-t"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for enc in _encodings(df, asked=True):
        cells = [enc, _params(df, enc, False)]
        for peer in (False, True):
            row = _pick(df, enc, malloc, "train", length, peer)
            if peer and row is None and split_entry(enc)[0] not in PEER_ENCODINGS:
                cells += ["none in x-t", "-", "-", "-", "-"]
                continue
            tps = _tps(row)
            cells += [_cell_text(row, tps), _percent(mfu(tps, length, shape, datasheet)),
                      _percent(mfu(tps, length, shape, measured_peak)),
                      "-" if row is None or not tps else f"{row.peak_mb / 1024:.1f}",
                      "-" if row is None else _fmt(row.compile_s, ".0f")]
        ours, theirs = _pick(df, enc, malloc, "train", length, False), _pick(df, enc, malloc, "train", length, True)
        cells.append(f"{_tps(ours) / _tps(theirs):.2f}" if _tps(ours) and _tps(theirs) else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


TRAINER_WITHIN = 0.05  # the real trainer's tokens/s at most this far below the bench's loop (the GPU issue's target)


def _trainer_pairs(df):
    """(model, encoding, malloc, length, the bench loop's row, the trainer's row) for every
    training figure measured both ways (``--trainer``)."""
    tr = df[df.kind == "train"]
    for _, row in tr[tr.impl == "posbench train"].iterrows():
        loop = _pick(tr[tr.model == row.model], row.encoding, row.malloc, "train", row.length, False)
        yield row.model, row.encoding, row.malloc, row.length, loop, row


def _trainer_table(df) -> list[str]:
    """The real trainer (``posbench train``) beside the bench's own loop, figure by figure."""
    pairs = list(_trainer_pairs(df))
    if not pairs:
        return []
    out = ["### The trainer against the bench's loop", "",
           "`posbench train` at the same shape, batch and precision, on the packaged corpus (data pipeline, "
           "schedule, each step's checks and logging included), against the bench's loop of model, loss, "
           "clipping and AdamW on random tokens: the median window of 5 steps after two windows of compiling "
           "and warm-up.", "",
           "| model | encoding | malloc | T | bench loop tok/s | trainer tok/s | trainer / loop |",
           "|---|---|---|---|---|---|---|"]
    for model, enc, malloc, length, loop, trainer in pairs:
        ratio = f"{_tps(trainer) / _tps(loop):.2f}" if _tps(trainer) and _tps(loop) else "-"
        out.append(f"| {model} | {enc} | {malloc} | {length} | {_cell_text(loop, _tps(loop))} | "
                   f"{_cell_text(trainer, _tps(trainer))} | {ratio} |")
    return out + [""]


def _shape_line(name: str, shape: dict) -> str:
    return (f"model={name}: {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads, "
            f"FFN {shape['d_ff']}, vocabulary {shape['vocab']}")


def tables(result: dict) -> str:
    """bench.md: the command, machine, per model a training and an evaluation table, kernels, targets."""
    machine, df = result["machine"], measured(result)
    precision = machine.get("precision", "bf16")
    peak = machine["bfloat16_gflops" if precision == "bf16" else "float32_gflops"]
    n = machine.get("matmul_n", MATMUL_N["cpu"])
    dtypes = (("float32", "fp32"), ("bfloat16", "bf16"))
    peaks = ", ".join(f"{name} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d, name in dtypes
                      if f"{d}_gflops" in machine)
    gpu = machine.get("device") == "cuda"
    where = (f"GPU {machine['cpu']} ({machine['cores']} host cores)" if gpu
             else f"{machine['cpu']}, {machine['cores']} cores")
    autocast = " autocast" if precision == "bf16" else f" (no bf16 autocast on this {'GPU' if gpu else 'CPU'})"
    out = [f"Command: `{result['command']}`", ""] if result.get("command") else []
    out += [f"Machine: {where}, torch {machine['torch']}. Matmul {n}^3: {peaks}."
            + (" Peak MB: the GPU's allocated memory (torch.cuda.max_memory_allocated)." if gpu else ""), ""]
    if machine.get("jobs", 1) > 1:
        out += [f"{machine['jobs']} children at once, in waves: a wave's children compiled side by side, then "
                "timed one at a time once every one of them had compiled, the others waiting (nothing compiled "
                "beside a timed figure).", ""]
    models = list(dict.fromkeys(df.model))
    if gpu:
        datasheet = machine.get("datasheet_bf16_tflops")
        out += [f"bf16{autocast}, fused AdamW, gradient clipping; compiled where the compile column has a time. "
                "MFU: training FLOP/s (6 N + 6 n_layers d_model T a token, posbench/bench/children.py) against the "
                + (f"datasheet dense bf16 peak of this GPU, {datasheet:,.1f} TFLOP/s" if datasheet else
                   f"datasheet dense bf16 peak, which posbench does not know for a {machine['cpu']}: MFU n/a "
                   "(posbench/bench/children.py DENSE_BF16_TFLOPS)")
                + f"; of matmul peak: against the bf16 {n}^3 product measured in this run. x-transformers (x-t) "
                "with attn_flash (t5: without; x-transformers refuses it there), "
                "at posbench's head dimension with tied "
                "embeddings; 'none in x-t': it has no such "
                "encoding. Each figure: the median step of the timed steps.", ""]
    for model in models:
        sub, shape = df[df.model == model], model_shape(model)
        if gpu:
            train = sub[sub.kind == "train"]
            for length in sorted(set(train.length)):
                counts = ", ".join(f"{int(t):,}" for t in sorted(set(train[train.length == length].tokens)))
                for malloc in [m for m in MALLOCS if m in set(train.malloc)]:
                    out += [f"### Training, {_shape_line(model, shape)}; T={length}, {counts} tokens a step"
                            + (f", malloc={malloc}" if len(set(train.malloc)) > 1 else ""), ""]
                    out += _gpu_table(sub, machine, shape, length, malloc)
            out += _model_table(sub, "eval", peak, shape)
        else:
            if len(models) > 1:
                out += [f"## {_shape_line(model, shape)}", ""]
            out += [f"Model: {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads, "
                    f"FFN {shape['d_ff']}, vocabulary {shape['vocab']}; {precision}{autocast}. x-transformers (x-t): "
                    "the faster of attn_flash off/on per cell, at posbench's head dimension with tied embeddings; each "
                    "ratio compares the two under the same allocator setting (malloc: glibc's default `system`, or "
                    f"posbench's `posbench`). FLOP/s against the {precision} matmul peak.", ""]
            out += _model_table(sub, "train", peak, shape) + _model_table(sub, "eval", peak, shape)
    out += _trainer_table(df)
    if result["kernels"]:
        out += [f"### Attention kernels: one ALiBi layer at 8,192 tokens ({precision}, no grad)", "",
                "| kernel | s/layer | compile s | peak MB |", "|---|---|---|---|"]
        for k in result["kernels"]:
            out.append(f"| {k['kernel']} | {k.get('error') or format(k['seconds'], '.3f')} | "
                       f"{_fmt(k.get('compile_s'), '.0f')} | {_fmt(k.get('peak_mb'))} |")
        out.append("")
    lines = gpu_targets(df, machine) if gpu else [
        (f"model={model}: " if len(models) > 1 else "") + line
        for model in models for line in targets(df[df.model == model])]
    out += ["### Targets", ""] + [f"- {line}" for line in lines]
    return "\n".join(out) + "\n"


GPU_MFU_TARGETS = {"rope": 0.40, "nope": 0.40}  # at model=base; every static-bias encoding: STATIC_BIAS_MFU


STATIC_BIAS_MFU = 0.30


def gpu_targets(df, machine: dict) -> list[str]:
    """The GPU issue's targets, each with its figures: at model=base, MFU >= 40% for rope and nope
    and >= 30% for every static-bias encoding (hook ``bias``); at every model, posbench's
    training ahead of x-transformers' for each encoding it has."""
    from ..encodings import REGISTRY

    lines = []
    datasheet = machine.get("datasheet_bf16_tflops")
    tr = df[df.kind == "train"]
    malloc = "system" if "system" in set(tr.malloc) else next(iter(set(tr.malloc)), "system")
    if not datasheet:
        lines.append(f"MFU not judged: no datasheet bf16 peak for a {machine.get('cpu')} (posbench/bench/children.py "
                     "DENSE_BF16_TFLOPS)")
    for model in dict.fromkeys(tr.model):
        sub, shape = tr[tr.model == model], model_shape(model)
        for length in sorted(set(sub.length)):
            for enc in _encodings(sub, asked=True):
                name = split_entry(enc)[0]
                ours = _pick(sub, enc, malloc, "train", length, False)
                theirs = _pick(sub, enc, malloc, "train", length, True)
                goal = GPU_MFU_TARGETS.get(enc) or (STATIC_BIAS_MFU if name in REGISTRY and
                                                    REGISTRY[name].hook_kind() == "bias" and enc == name else None)
                if datasheet and model == "base" and goal:
                    got = mfu(_tps(ours), length, shape, datasheet)
                    lines.append(f"{'met' if got is not None and got >= goal else 'NOT met'}: {enc} at model=base, "
                                 f"T={length}: MFU >= {goal:.0%} ("
                                 + (f"{got:.1%}" if got is not None else _cell_text(ours, None)) + ")")
                if _tps(ours) and _tps(theirs):
                    ratio = _tps(ours) / _tps(theirs)
                    lines.append(f"{'met' if ratio > 1 else 'NOT met'}: {enc} at model={model}, T={length} ahead of "
                                 f"x-transformers ({_tps(ours):,.0f} vs {_tps(theirs):,.0f} tok/s, {ratio:.2f}x)")
    for model, enc, _, length, loop, trainer in _trainer_pairs(df[df.malloc == malloc]):
        if _tps(trainer) and _tps(loop):
            ratio = _tps(trainer) / _tps(loop)
            lines.append(f"{'met' if ratio >= 1 - TRAINER_WITHIN else 'NOT met'}: the trainer (posbench train) within "
                         f"{TRAINER_WITHIN:.0%} of the bench's loop, {enc} at model={model}, T={length} "
                         f"({_tps(trainer):,.0f} vs {_tps(loop):,.0f} tok/s, {ratio:.2f}x)")
    return lines


def targets(df) -> list[str]:
    """The performance issue's targets, each with the figures it is judged on: posbench's own
    figures under its default allocator setting, and each training ratio under equal settings."""
    lines = []
    if "malloc" not in df:
        df = df.assign(malloc="posbench")
    own = "posbench" if (df[df.impl == "posbench"].malloc == "posbench").any() else "system"
    ev = df[(df.kind == "eval") & (df.impl == "posbench") & (df.malloc == own)]
    longest = ev.length.max() if len(ev) else None
    if longest:
        at = ev[ev.length == longest]
        worst = at.loc[at.peak_mb.idxmax()] if at.peak_mb.notna().any() else None
        failed = at[at.tokens_per_s.isna()]
        ok = worst is not None and worst.peak_mb < 2048 and failed.empty
        lines.append(f"{'met' if ok else 'NOT met'}: every encoding evaluates at {longest:,} tokens under 2 GB peak"
                     + (f" (highest: {worst.encoding} {worst.peak_mb:,.0f} MB)" if worst is not None else "")
                     + (f"; failed: {', '.join(failed.encoding)}" if len(failed) else ""))

    def seconds(enc, n):
        r = ev[(ev.encoding == enc) & (ev.length == n)]
        return r.seconds.iloc[0] if len(r) and r.seconds.notna().iloc[0] else None

    for enc in ("alibi", "t5"):
        mine, rope = seconds(enc, 8192), seconds("rope", 8192)
        if mine and rope:
            lines.append(f"{'met' if mine <= 2 * rope else 'NOT met'}: {enc} evaluation at 8,192 tokens within 2x of "
                         f"rope's time ({mine:.2f} s vs {rope:.2f} s, {mine / rope:.2f}x)")
    tr = df[df.kind == "train"]
    for malloc in [m for m in MALLOCS if m in set(tr.malloc)]:
        for enc in ("rope", "alibi", "t5"):
            for n in sorted(set(tr.length)):
                ours, theirs = _pick(tr, enc, malloc, "train", n, False), _pick(tr, enc, malloc, "train", n, True)
                if _tps(ours) and _tps(theirs):
                    ratio = _tps(ours) / _tps(theirs)
                    lines.append(f"{'met' if ratio >= 1.3 else 'NOT met'}: {enc} training at T={n} >= 1.3x "
                                 f"x-transformers, both under malloc={malloc} ({_tps(ours):,.0f} vs "
                                 f"{_tps(theirs):,.0f} tok/s, {ratio:.2f}x)")
    return lines
