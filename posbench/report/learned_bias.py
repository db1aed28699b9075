"""Draw what was learned: an encoding's additive bias as a function of distance, per head.

The KERPLE paper (Chi et al. 2022, fig. 2) and the FIRE paper (Li et al. 2024, fig. 4) show
their learned biases this way. :func:`bias_by_distance` evaluates the encoding's own ``bias``
hook for one query at position ``max_distance`` against keys 0 .. max_distance, so every
distance 0 .. max_distance appears once (for FIRE, whose bias also depends on the query
position, this is the bias that query sees). Per-layer schemes (``layer_invariant_bias``
False) get one row set per layer.

- :func:`learned_bias_figure`: one panel per layer, one line per head (gid ``bias:<layer>:<head>``).
- :func:`write_run_figure`: ``learned_bias.png`` / ``.svg`` in a run dir (``posbench train``
  and ``posbench eval``).
- :func:`write_report_figure`: ``learned_bias.png`` / ``.svg`` in a report dir, one panel per
  encoding, every run's heads (gid ``bias:<encoding>:<run #>:<layer>:<head>``), from each run's
  checkpoint, or from the ``learned_bias.npz`` table an exported run keeps in its place
  (:func:`posbench.report.baselines.export_baseline`: the table, not the weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..encodings import PositionEncoding

COLUMNS = ["layer", "head", "distance", "bias"]
FILE = "learned_bias.png"
TABLE_FILE = "learned_bias.npz"  # an exported run's bias by distance (no checkpoint to rebuild it from)


def has_learned_bias(encoding: PositionEncoding) -> bool:
    """True when the encoding adds a ``bias`` with trainable parameters (t5, kerple, fire,
    dynamic, alibi with learned slopes; dape on a learned base: its MLP is not the bias)."""
    own = encoding.base.parameters() if isinstance(getattr(encoding, "base", None), PositionEncoding) else \
        encoding.parameters()  # a wrapper (dape) draws the bias of the encoding it wraps
    return "bias" in encoding.hooks() and any(p.requires_grad for p in own)


def bias_by_distance(encoding: PositionEncoding, max_distance: int) -> pd.DataFrame:
    """-> rows (layer, head, distance, bias) for distances 0 .. ``max_distance``, one set per
    layer where the bias differs by layer (else layer 0 only)."""
    q_pos = torch.tensor([int(max_distance)])
    k_pos = torch.arange(int(max_distance) + 1)  # (D+1,), distance = max_distance - j
    layers = [0] if encoding.layer_invariant_bias else range(encoding.dims.n_layers)
    frames = []
    with torch.no_grad():
        for layer in layers:
            bias = encoding.bias(q_pos, k_pos, layer).float()[:, 0, :].cpu()  # (H, D+1)
            H, n = bias.shape
            frames.append(pd.DataFrame({
                "layer": layer, "head": torch.arange(H).repeat_interleave(n).numpy(),
                "distance": (int(max_distance) - k_pos).repeat(H).numpy(), "bias": bias.flatten().numpy()}))
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    return table.sort_values(["layer", "head", "distance"], ignore_index=True)


def _draw(ax, table: pd.DataFrame, gid_prefix: str, colours: list) -> None:
    for (layer, head), rows in table.groupby(["layer", "head"]):
        ax.plot(rows.distance, rows.bias, color=colours[int(head) % len(colours)], linewidth=1,
                gid=f"{gid_prefix}{layer}:{head}", label=f"head {head}")
    ax.set_xlabel("distance i - j")
    ax.grid(alpha=0.3)


def _figure(panels: int):
    """A bare matplotlib Figure (no pyplot state) with ``panels`` axes side by side, and the colour cycle."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.4, 4.5 * panels), 3.4))  # one panel: wide enough for the title
    return fig, fig.subplots(1, panels, squeeze=False), matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


def learned_bias_figure(table: pd.DataFrame, title: str, caption: str = ""):
    """One run's bias by distance: a panel per layer in ``table``, a line per head; ``caption``
    (the run's setup: model, corpus, steps, tokens) under the title."""
    layers = sorted(table.layer.unique())
    fig, axes, colours = _figure(len(layers))
    for ax, layer in zip(axes[0], layers):
        _draw(ax, table[table.layer == layer], "bias:", colours)
        ax.set_title(f"layer {layer}" if len(layers) > 1 else "all layers")
    axes[0][0].set_ylabel("bias added to the logit")
    axes[0][-1].legend(fontsize="small", ncol=2)
    fig.suptitle(_titled(title, caption, fig))
    fig.tight_layout()
    return fig


def _titled(title: str, caption: str, fig) -> str:
    from .figures import wrapped

    return title + (f"\n{wrapped(caption, fig)}" if caption else "")


def _default_distance(encoding: PositionEncoding) -> int:
    return 4 * encoding.dims.train_len  # past the training length, to show how it extrapolates


def write_run_figure(encoding: PositionEncoding, run_dir: str | Path, max_distance: int | None = None,
                     caption: str = "") -> list[Path]:
    """``learned_bias.png`` and ``.svg`` in ``run_dir`` when the encoding has a learned bias,
    ``caption`` (the run's setup) under its title; -> the files written (none otherwise)."""
    from .figures import save

    if not has_learned_bias(encoding):
        return []
    table = bias_by_distance(encoding, max_distance or _default_distance(encoding))
    fig = learned_bias_figure(table, f"{encoding.name}: learned bias by distance", caption)
    return save(fig, Path(run_dir) / FILE, also_svg=True)


def _encoding_options(cfg) -> dict:
    """A run config's encoding options, as the run's encoding was built from them."""
    from omegaconf import OmegaConf

    from ..encodings import saved_options

    return saved_options(OmegaConf.to_container(cfg.encoding, resolve=True))


def trained_encoding(run_dir: str | Path) -> tuple[dict, PositionEncoding] | None:
    """A trained run's encoding options and its encoding with the checkpoint's weights (only the
    encoding is rebuilt), or None when the run has no config or checkpoint."""
    from omegaconf import OmegaConf

    from ..config import model_config
    from ..encodings import build_encoding
    from ..model.transformer import LanguageModel
    from ..runs.rundir import RunDir, load_checkpoint

    run = RunDir(run_dir)
    if not (run.config.is_file() and run.checkpoint.is_file()):
        return None
    cfg = OmegaConf.load(run.config)
    options = _encoding_options(cfg)
    weights = load_checkpoint(run.checkpoint)["model"]
    dims = LanguageModel.dims(model_config(cfg.model), int(cfg.train.train_len), weights["tok_emb.weight"].shape[0])
    encoding = build_encoding(options, dims)
    encoding.load_state_dict({k.removeprefix("encoding."): v for k, v in weights.items() if k.startswith("encoding.")})
    return options, encoding


def write_bias_table(table: pd.DataFrame, path: str | Path) -> None:
    """``table`` (:func:`bias_by_distance`'s rows) as compressed columns: the bias in float32, as
    :func:`bias_by_distance` computes it, so a figure drawn from the file is the checkpoint's."""
    from ..runs.rundir import atomic_write

    columns = {"layer": table.layer.to_numpy(np.int16), "head": table["head"].to_numpy(np.int16),
               "distance": table.distance.to_numpy(np.int32), "bias": table.bias.to_numpy(np.float32)}
    atomic_write(Path(path), lambda f: np.savez_compressed(f, **columns))


def read_bias_table(path: str | Path) -> pd.DataFrame:
    with np.load(path) as f:
        return pd.DataFrame({c: f[c] for c in COLUMNS})


def run_bias(run_dir: str | Path) -> tuple[dict, pd.DataFrame] | None:
    """A run's encoding config and its bias by distance: from its checkpoint, or from an exported
    run's ``learned_bias.npz`` and config.yaml; None when it has no learned bias (or neither)."""
    found = trained_encoding(run_dir)
    if found is None:
        run = Path(run_dir)
        if not ((run / TABLE_FILE).is_file() and (run / "config.yaml").is_file()):
            return None
        from omegaconf import OmegaConf

        return _encoding_options(OmegaConf.load(run / "config.yaml")), read_bias_table(run / TABLE_FILE)
    if not has_learned_bias(found[1]):
        return None
    options, encoding = found
    return options, bias_by_distance(encoding, _default_distance(encoding))


def _labels(configs: list[dict]) -> list[str]:
    """The encoding name, with the options that tell apart configs of the same name."""
    labels = []
    for cfg in configs:
        same = [c for c in configs if c["name"] == cfg["name"]]
        differ = sorted(k for k in cfg if k != "name" and len({repr(c.get(k)) for c in same}) > 1)
        labels.append(" ".join([cfg["name"]] + [f"{k}={cfg[k]}" for k in differ]))
    return labels


def write_report_figure(runs: list[str | Path], out: str | Path, caption: str = "") -> list[Path]:
    """``learned_bias.png`` / ``.svg`` in ``out``: a panel per encoding (config), drawing every
    run's bias by distance, every layer and head, ``caption`` (the runs' setup) under the title;
    nothing when no run has a learned bias."""
    from .figures import save

    found = [(str(run), got) for run in sorted(map(str, runs)) if (got := run_bias(run)) is not None]
    if not found:
        return []
    configs = []
    for _, (options, _) in found:
        if options not in configs:
            configs.append(options)
    labels = _labels(configs)
    fig, axes, colours = _figure(len(configs))
    for ax, options, label in zip(axes[0], configs, labels):
        mine = [table for _, (o, table) in found if o == options]
        for number, table in enumerate(mine):
            _draw(ax, table, f"bias:{label}:{number}:", colours)
        ax.set_title(f"{label} ({len(mine)} run{'s' * (len(mine) > 1)})")
    axes[0][0].set_ylabel("bias added to the logit")
    fig.suptitle(_titled("learned bias by distance (a line per head, layer and run)", caption, fig))
    fig.tight_layout()
    return save(fig, Path(out) / FILE, also_svg=True)
