"""Convert a trained rotary run between RoPE pairings without retraining.

``half`` rotates pairs (x_i, x_{i + hs/2}), ``interleaved`` pairs (x_{2i}, x_{2i+1}), each by
p * theta_i (see :mod:`posbench.encodings.rotary`). Moving each head's q and k dimensions so
that pair i of one layout lands on pair i of the other gives the same rotations, and q.k is
unchanged because q and k are permuted alike. q and k come from the rows of each layer's
``qkv`` projection, so a conversion permutes those rows (and the matching rows of AdamW's
moments, so training can resume in the new run dir); v and everything else are untouched.
This is the permutation of Hugging Face's LLaMA conversion script (``permute``), which turns
Meta's interleaved checkpoints into rotate-half ones.

    posbench convert outputs/train/rope/default --pairing interleaved --out outputs/train/rope/interleaved
    posbench eval checkpoint=outputs/train/rope/interleaved   # same perplexities
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .config import PAIRINGS, TrainConfig, config_hash, model_config, typed
from .encodings import REGISTRY
from .encodings.rotary import Rotary, check_pairing
from .errors import PosbenchError
from .runs.rundir import RunDir, atomic_write_text, load_checkpoint, save_checkpoint


def pairing_permutation(head_dim: int, source: str, target: str) -> torch.Tensor:
    """Index ``perm`` with new[..., d] = old[..., perm[d]] over one head's dimensions, so that
    a vector laid out for ``source`` pairing is laid out for ``target``. (hs,) long."""
    check_pairing(source), check_pairing(target)
    half = head_dim // 2
    # dimension of pair i's first and second member under each pairing
    members = {"half": (torch.arange(half), torch.arange(half) + half),
               "interleaved": (2 * torch.arange(half), 2 * torch.arange(half) + 1)}
    perm = torch.empty(head_dim, dtype=torch.long)
    for new, old in zip(members[target], members[source]):
        perm[new] = old
    return perm


def permute_qkv_rows(weight: torch.Tensor, n_heads: int, perm: torch.Tensor) -> torch.Tensor:
    """weight: (3 D, ...) rows ordered (q|k|v, head, dim) as the model's ``qkv`` view reads them.
    Permutes each head's dims of q and k by ``perm``; v rows are kept."""
    three_d = weight.shape[0]
    head_dim = three_d // 3 // n_heads
    w = weight.view(3, n_heads, head_dim, *weight.shape[1:])
    out = w.clone()
    out[:2] = w[:2, :, perm]  # q and k
    return out.view_as(weight)


def qkv_names(n_layers: int) -> list[str]:
    return [f"blocks.{layer}.attn.qkv.weight" for layer in range(n_layers)]


def convert_model_state(state: dict, n_layers: int, n_heads: int, perm: torch.Tensor) -> dict:
    """A copy of a model state_dict with every layer's q and k rows permuted."""
    out = dict(state)
    for name in qkv_names(n_layers):
        out[name] = permute_qkv_rows(state[name], n_heads, perm)
    return out


def _convert_optimizer_state(cfg, model_state: dict, optimizer_state: dict, n_heads: int,
                             perm: torch.Tensor) -> dict:
    """Permute AdamW's per-parameter tensors of the qkv weights like the weights themselves.
    The optimizer indexes parameters by their order in ``make_optimizer``'s groups."""
    from .model.build import build_model
    from .train.optim import make_optimizer

    vocab_size = model_state["tok_emb.weight"].shape[0]
    model = build_model(cfg, vocab_size)
    optimizer = make_optimizer(model, typed(TrainConfig, cfg.train, "train"))
    index = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    params = dict(model.named_parameters())
    state = {**optimizer_state, "state": dict(optimizer_state["state"])}
    for name in qkv_names(len(model.blocks)):
        i = index[id(params[name])]
        if i in state["state"]:
            state["state"][i] = {key: permute_qkv_rows(value, n_heads, perm)
                                 if torch.is_tensor(value) and value.shape == params[name].shape else value
                                 for key, value in state["state"][i].items()}
    return state


def convert_run(run_dir: str | Path, pairing: str, out: str | Path) -> Path:
    """Write ``out``: ``run_dir``'s config with ``encoding.pairing`` set to ``pairing`` and its
    last checkpoint with q and k permuted to match. -> the new run dir."""
    check_pairing(pairing)
    if not Path(run_dir).expanduser().exists():
        raise PosbenchError(f"run dir {str(run_dir)!r} does not exist; pass a directory made by `posbench train`")
    run = RunDir.existing(run_dir)
    target = RunDir(Path(out).expanduser())
    if target.path.resolve() == run.path.resolve():
        raise PosbenchError(f"--out {str(out)!r} is the run being converted; choose a new directory")
    if target.path.exists() and any(target.path.iterdir()):
        raise PosbenchError(f"--out {str(out)!r} exists and is not empty; choose a new directory")
    cfg = OmegaConf.load(run.config)
    name = str(cfg.encoding.name)
    if not issubclass(REGISTRY.get(name, object), Rotary):
        rotary = sorted(n for n, cls in REGISTRY.items() if issubclass(cls, Rotary))
        raise PosbenchError(f"convert changes the RoPE pairing of a rotary run ({', '.join(rotary)}); "
                            f"{str(run_dir)!r} uses {name!r}")
    source = str(cfg.encoding.get("pairing", "half"))  # runs from before the option used half
    check_pairing(source)

    mcfg = model_config(cfg.model)
    perm = pairing_permutation(mcfg.d_model // mcfg.n_heads, source, pairing)
    state = load_checkpoint(run.checkpoint)
    cfg.encoding.pairing = pairing
    new_state = {**state, "model": convert_model_state(state["model"], mcfg.n_layers, mcfg.n_heads, perm),
                 "config_hash": config_hash(cfg)}
    if "optimizer" in state:
        new_state["optimizer"] = _convert_optimizer_state(cfg, state["model"], state["optimizer"],
                                                          mcfg.n_heads, perm)
    try:
        target.path.mkdir(parents=True, exist_ok=True)
        save_checkpoint(target.checkpoint, {k: v for k, v in new_state.items() if k != "format"})
        atomic_write_text(target.config, OmegaConf.to_yaml(cfg, resolve=True))
        if run.metrics.is_file():  # the training curve of the same function
            shutil.copyfile(run.metrics, target.metrics)
    except BaseException:
        shutil.rmtree(target.path, ignore_errors=True)
        raise
    return target.path


__all__ = ["PAIRINGS", "convert_model_state", "convert_run", "pairing_permutation", "permute_qkv_rows"]
