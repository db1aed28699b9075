"""The model options that compose with any encoding, against their definitions written out
independently: model.length_scaling (log-n and SSMax) and model.qk_norm."""

import math

import pytest
import torch

from conftest import compose
from posbench.config import ModelConfig, TrainConfig, config_hash, model_config
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.encodings.extension import Extension, logn_factor
from posbench.model.transformer import LanguageModel
from posbench.testing import check_encoding
from posbench.train.optim import make_optimizer

VOCAB, TRAIN_LEN = 40, 8


def model(encoding="alibi", scaling="none", chunk=1024, seed=0, qk_norm=False, model_window=0, n_layers=2,
          **options) -> LanguageModel:
    """A small model; ``options`` are the encoding's."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=n_layers, n_heads=4, d_ff=64, attn_chunk=chunk, length_scaling=scaling,
                      qk_norm=qk_norm, window=model_window)
    enc = build_encoding({"name": encoding, **options}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB))
    net = LanguageModel(cfg, VOCAB, enc)
    if scaling == "ssmax":  # off its constant init, so a wrong (layer, head) index shows
        with torch.no_grad():
            net.length_scaling.s.uniform_(0.2, 0.8)
    if qk_norm:  # gains off their init of ones
        with torch.no_grad():
            for block in net.blocks:
                block.attn.q_norm.weight.uniform_(0.5, 2.0)
                block.attn.k_norm.weight.uniform_(0.5, 2.0)
    return net.eval()


def qwen_logn(i: int, seq_length: int) -> float:
    """Qwen's ``logn_list`` entry for the query that is the i-th token (1-based)."""
    return math.log(i, seq_length) if i > seq_length else 1.0


def direct_logits(net: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """The model's forward with full (T, T) attention in fp32, each query's factor computed
    per token from the papers' formulas: log-n max(1, log_L(i + 1)), SSMax s[l, h] ln(i + 1)."""
    enc, cfg = net.encoding, net.cfg
    B, T = x.shape
    pos = torch.arange(T)
    H, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    h = enc.embed(net.tok_emb(x) * net.emb_scale, pos, x)
    for layer, block in enumerate(net.blocks):
        q, k, v = block.attn.qkv(block.ln1(h)).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
        if cfg.qk_norm:  # x / sqrt(mean(x^2) + eps) * gain over each head's dims
            q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + 1e-6) * block.attn.q_norm.weight
            k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + 1e-6) * block.attn.k_norm.weight
        q, k = enc.rotate(q, k, pos, layer)
        factor = torch.ones(H, T)
        for i in range(T):
            for head in range(H):
                if cfg.length_scaling == "logn":
                    factor[head, i] = qwen_logn(i + 1, TRAIN_LEN)
                elif cfg.length_scaling == "ssmax":
                    factor[head, i] = net.length_scaling.s[layer, head].item() * math.log(i + 1)
        q = q * factor[None, :, :, None]
        logits = q @ k.transpose(-1, -2)
        if "score" in enc.hooks():
            logits = logits + enc.score(q, k, pos, pos, layer)
        logits = logits * enc.logit_scale()
        if "bias" in enc.hooks():
            logits = logits + enc.bias(pos, pos, layer)
        window = min([w for w in (cfg.window, enc.attention_window(layer)) if w], default=0)
        hidden = pos[None, :] > pos[:, None]
        if window:  # query i sees keys i - window < j <= i
            hidden = hidden | (pos[:, None] - pos[None, :] >= window)
        probs = logits.masked_fill(hidden, float("-inf")).softmax(-1)
        out = probs @ v
        if "value" in enc.hooks():
            out = out + enc.value(probs, pos, pos, layer)
        h = h + block.attn.proj(out.transpose(1, 2).reshape(B, T, cfg.d_model))
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


def test_logn_factor_is_qwens_logn_list():
    n = torch.arange(1, 6 * TRAIN_LEN + 1)
    want = torch.tensor([qwen_logn(int(i), TRAIN_LEN) for i in n])
    assert torch.allclose(logn_factor(n, TRAIN_LEN), want, rtol=1e-6)
    ext = Extension("logn", train_len=TRAIN_LEN)  # the pretrained models' log-n is the same factor
    assert torch.allclose(ext.query_scale(n - 1), want, rtol=1e-6)


@pytest.mark.parametrize("scaling", ["logn", "ssmax"])
@pytest.mark.parametrize("encoding, chunk", [("alibi", 1024), ("alibi", 8), ("rope", 1024), ("shaw", 8), ("nope", 1024)])
def test_the_model_computes_the_definition(encoding, chunk, scaling):
    """Through every kernel: SDPA with one bias, ALiBi's Toeplitz slices (chunk 8 < T), rotary,
    Shaw's content terms in query chunks, no encoding."""
    net, x = model(encoding, scaling, chunk), torch.randint(0, VOCAB, (2, 5 * TRAIN_LEN))
    with torch.no_grad():
        got, want = net(x), direct_logits(net, x)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("encoding, chunk, scaling", [("rope", 1024, "none"), ("alibi", 8, "none"), ("nope", 8, "ssmax")])
def test_qk_norm_computes_the_definition(encoding, chunk, scaling):
    net, x = model(encoding, scaling, chunk, qk_norm=True), torch.randint(0, VOCAB, (2, 5 * TRAIN_LEN))
    with torch.no_grad():
        got, want = net(x), direct_logits(net, x)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()
    assert "blocks.0.attn.q_norm.weight" in net.state_dict()
    assert "blocks.0.attn.q_norm.weight" not in model(encoding).state_dict()  # off: checkpoints as before
    assert check_encoding(encoding, model={"qk_norm": True}, checks=["causality", "kernels", "bf16"])


@pytest.mark.parametrize("encoding, chunk, grad", [("rope", 8, False), ("nope", 1024, True), ("alibi", 8, False),
                                                   ("alibi", 1024, False), ("shaw", 8, False), ("t5", 8, True)])
def test_sliding_window_computes_the_definition(encoding, chunk, grad):
    """model.window through every path: chunked SDPA with a window mask (no bias), training's
    explicit path, ALiBi's Toeplitz slices and single mask, Shaw's content chunks."""
    net, x = model(encoding, chunk=chunk, model_window=5), torch.randint(0, VOCAB, (2, 4 * TRAIN_LEN))
    with torch.set_grad_enabled(grad):
        got = net(x)
    with torch.no_grad():
        want = direct_logits(net, x)
        unwindowed = model(encoding, chunk=chunk)(x)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()
    assert torch.allclose(got[:, :5], unwindowed[:, :5], atol=1e-5)  # the first 5 queries see every key anyway
    assert not torch.allclose(got[:, 5:], unwindowed[:, 5:], atol=1e-4)


def test_rnope_swa_windows_the_rope_layers_and_leaves_nope_layers_global():
    net = model("rope_nope", n_layers=4, chunk=8, nope_every=2, window=6)
    assert [net.encoding.attention_window(layer) for layer in range(4)] == [6, 0, 6, 0]
    x = torch.randint(0, VOCAB, (2, 4 * TRAIN_LEN))
    with torch.no_grad():
        assert torch.allclose(net(x), direct_logits(net, x), atol=2e-5, rtol=1e-4)
    assert check_encoding("rope_nope", {"nope_every": 2, "window": 6}, checks=["causality", "kernels"])
    assert check_encoding("alibi", model={"window": 7}, checks=["causality", "kernels", "long"])
    with pytest.raises(PosbenchError, match=r"model.window=-1 is not valid; valid: 0 \(full causal attention\)"):
        model_config({"window": -1})


def test_logn_leaves_the_training_length_alone():
    """Its factor is 1 for the first train_len queries: those logits equal the unscaled model's,
    the later ones differ."""
    plain, logn = model("rope"), model("rope", "logn")
    logn.load_state_dict(plain.state_dict())  # same weights: log-n has no parameters
    x = torch.randint(0, VOCAB, (1, 4 * TRAIN_LEN))
    with torch.no_grad():
        a, b = plain(x), logn(x)
    assert torch.equal(a[:, :TRAIN_LEN], b[:, :TRAIN_LEN])
    later = (a[:, TRAIN_LEN:] - b[:, TRAIN_LEN:]).abs().amax(-1)
    assert (later > 0).all() and later.max() > 1e-5


def test_ssmax_scales_are_learned_undecayed_parameters_and_other_models_are_as_before():
    assert "length_scaling.s" not in model("alibi").state_dict()  # a checkpoint without scaling is unchanged
    assert "length_scaling.s" not in model("alibi", "logn").state_dict()
    net = model("alibi", "ssmax").train()
    s = net.length_scaling.s
    assert s.shape == (2, 4)
    optimizer = make_optimizer(net, TrainConfig(weight_decay=0.1))
    assert [g["weight_decay"] for g in optimizer.param_groups if any(p is s for p in g["params"])] == [0.0]
    before = s.detach().clone()
    x = torch.randint(0, VOCAB, (4, TRAIN_LEN + 1))
    for _ in range(3):
        optimizer.zero_grad()
        net(x[:, :-1], targets=x[:, 1:]).backward()
        optimizer.step()
    assert (s.detach() - before).abs().min() > 0  # every (layer, head) moved
    torch.manual_seed(0)
    fresh = LanguageModel(ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, length_scaling="ssmax",
                                      ssmax_init=0.3), VOCAB, build_encoding({"name": "nope"}, net.encoding.dims))
    assert torch.equal(fresh.length_scaling.s, torch.full((2, 4), 0.3))


@pytest.mark.parametrize("scaling", ["logn", "ssmax"])
def test_conformance_with_scaling(scaling):
    assert check_encoding("t5", model={"length_scaling": scaling})[-1] == "long"


def test_config_hash_and_errors():
    assert config_hash(compose()) == "5905295095c6"  # the default job's hash from before the option
    assert config_hash(compose("model.ssmax_init=0.5")) == "5905295095c6"  # read only under ssmax
    assert config_hash(compose("model.qk_norm=true")) != "5905295095c6"
    assert config_hash(compose("model.window=0")) == "5905295095c6" != config_hash(compose("model.window=64"))
    hashes = {config_hash(compose(*o)) for o in (["model.length_scaling=logn"], ["model.length_scaling=ssmax"],
                                                  ["model.length_scaling=ssmax", "model.ssmax_init=0.5"])}
    assert len(hashes) == 3 and "5905295095c6" not in hashes
    with pytest.raises(PosbenchError, match=r"model.length_scaling='log' is not valid; valid choices: none, logn, ssmax"):
        ModelConfig(length_scaling="log")


def test_report_names_the_scaling_of_runs_from_before_the_option(tmp_path):
    """A config.yaml without model.length_scaling (every run before it) reads as 'none' in the
    report's diff and its --by lines."""
    from omegaconf import OmegaConf
    from test_report import rows, write_run

    from posbench.report.build import report

    old = write_run(tmp_path / "old", rows("alibi", 0, {32: 10.0, 64: 10.5}, chash="plain"))
    new = write_run(tmp_path / "ssmax", rows("alibi", 0, {32: 9.0, 64: 9.2}, chash="ssmax"))
    for run, model in ((old, {"name": "tiny"}), (new, {"name": "tiny", "length_scaling": "ssmax", "ssmax_init": 0.43})):
        config = OmegaConf.load(run / "config.yaml")
        config.model = model
        OmegaConf.save(config, run / "config.yaml")
    with pytest.raises(PosbenchError, match=r"model.length_scaling \(none in .*old, ssmax in .*ssmax\)"):
        report([tmp_path], tmp_path / "out", reference=None)
    done = report([tmp_path], tmp_path / "out", reference=None, by=["model.length_scaling"])
    assert "alibi [length_scaling=none]" in done.table and "alibi [length_scaling=ssmax]" in done.table
