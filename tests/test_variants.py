"""Variants of one named scheme as they exist across codebases: each option against formulas
written here, and, where the math says two variants are the same function, a test of that."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import SMOKE, compose
from posbench.model.attention import causal_attention
from posbench.model.build import build_model
from posbench.cli import main
from posbench.encodings import REGISTRY, ModelDims, PositionRangeError, build_encoding
from posbench.errors import PosbenchError
from posbench.model.transformer import LanguageModel, ModelConfig

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16)  # head_dim 8
HS, HALF = DIMS.head_dim, DIMS.d_model // 2
VOCAB = 50


def make(name, **params):
    torch.manual_seed(0)
    return build_encoding({"name": name, **params}, DIMS)


def model(name, seed=0, chunk=1024, **params):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk)
    enc = build_encoding({"name": name, **params}, LanguageModel.dims(cfg, 16, VOCAB))
    return LanguageModel(cfg, VOCAB, enc).eval()


def tokens(T=24, B=2, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def logits(m, x):
    with torch.no_grad():
        return m(x)


@pytest.mark.parametrize("overrides", [
    ["encoding=sinusoidal", "encoding.layout=concat"],
    ["encoding=multiplicative", "encoding.table=learned", "encoding.layout=concat"],
    ["encoding=rope", "encoding.pairing=interleaved"],
    ["encoding=xpos", "encoding.pairing=interleaved"],
    ["encoding=alibi", "encoding.form=symmetric", "encoding.learned_slopes=true"],
    ["encoding=t5", "encoding.per_layer=true", "encoding.num_buckets=8", "encoding.max_distance=16"],
    ["encoding=shaw", "encoding.max_distance=2"],
    ["encoding=shaw", "encoding.max_distance=64"],
])
def test_variant_overrides_compose_and_build(overrides):
    cfg = compose(*overrides, "model.d_model=32", "model.n_heads=4", "model.n_layers=2", "model.d_ff=64")
    enc = build_model(cfg, VOCAB).encoding
    for key, value in cfg.encoding.items():
        if key != "name":
            assert getattr(enc, {"table": "kind"}.get(key, key)) == value, key


@pytest.mark.parametrize("name, key, choices", [
    ("sinusoidal", "layout", "interleave, concat"), ("multiplicative", "table", "learned, sinusoidal"),
    ("multiplicative", "layout", "interleave, concat"), ("rope", "pairing", "half, interleaved"),
    ("xpos", "pairing", "half, interleaved"), ("alibi", "form", "causal, symmetric")])
def test_bad_variant_names_the_valid_choices(name, key, choices):
    with pytest.raises(PosbenchError, match=f"'bogus' is not valid; valid choices: {choices}"):
        make(name, **{key: "bogus"})


def test_multiplicative_is_listed(capsys):
    main(["encodings"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("multiplicative "))
    assert "embed" in line and "x * p_pos" in line


# ---- sinusoidal layout ----------------------------------------------------------------------

def interleave_reference(pos, d, base=10000.0):
    """Vaswani et al.: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(same)."""
    out = [0.0] * d
    for i in range(d // 2):
        out[2 * i] = math.sin(pos / base ** (2 * i / d))
        out[2 * i + 1] = math.cos(pos / base ** (2 * i / d))
    return torch.tensor(out)


def concat_reference(pos, d, base=10000.0):
    """[sin(pos w_0), .., sin(pos w_{h-1}), cos(pos w_0), .., cos(pos w_{h-1})],
    w_i = exp(-ln(base) * i / (h - 1)), h = d / 2."""
    h = d // 2
    w = [math.exp(-math.log(base) * i / (h - 1)) for i in range(h)]
    return torch.tensor([math.sin(pos * wi) for wi in w] + [math.cos(pos * wi) for wi in w])


REFERENCE = {"interleave": interleave_reference, "concat": concat_reference}
POSITIONS = (0, 1, 7, 100, 2047)


def added_table(enc, T=2048):
    x = torch.zeros(1, T, DIMS.d_model)
    return enc.embed(x, torch.arange(T), torch.zeros(1, T, dtype=torch.long))[0]  # (T, D)


@pytest.mark.parametrize("layout", ["interleave", "concat"])
def test_sinusoidal_layout_matches_its_formula(layout):
    pe = added_table(make("sinusoidal", layout=layout))
    for pos in POSITIONS:
        assert torch.allclose(pe[pos], REFERENCE[layout](pos, DIMS.d_model), atol=2e-4), pos
    assert make("sinusoidal").layout == "interleave"  # the default


def test_concat_layout_is_not_a_permutation_of_interleave():
    """The concat frequencies exp(-ln(b) i / (h - 1)) reach 1/b at the last pair; the
    interleaved ones b^(-2i/d) = b^(-i/h) stop at b^(-(h-1)/h). Only i = 0 (frequency 1) is
    shared, so no reordering of dimensions turns one table into the other."""
    h, b = HALF, 10000.0
    concat_freq = [math.exp(-math.log(b) * i / (h - 1)) for i in range(h)]
    interleave_freq = [b ** (-2 * i / DIMS.d_model) for i in range(h)]
    assert concat_freq[0] == interleave_freq[0] == 1.0
    assert concat_freq[-1] == pytest.approx(1 / b) and interleave_freq[-1] == pytest.approx(b ** (-(h - 1) / h))
    assert all(abs(c - f) > 1e-3 * f for c, f in zip(concat_freq[1:], interleave_freq[1:]))
    concat, interleave = added_table(make("sinusoidal", layout="concat")), added_table(make("sinusoidal"))
    matches = [[torch.allclose(concat[:, a], interleave[:, c], atol=1e-4) for c in range(DIMS.d_model)]
               for a in range(DIMS.d_model)]
    assert sum(any(row) for row in matches) == 2  # sin(pos) and cos(pos) only
    # a permutation of the interleaved table cannot match: sorted rows differ at a generic position
    assert not torch.allclose(concat[100].sort().values, interleave[100].sort().values, atol=1e-3)


# ---- multiplicative -------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["interleave", "concat"])
def test_multiplicative_sinusoidal_is_elementwise_product(layout):
    enc = make("multiplicative", table="sinusoidal", layout=layout)
    torch.manual_seed(2)
    x = torch.randn(2, 30, DIMS.d_model)
    out = enc.embed(x, torch.arange(30), torch.zeros(2, 30, dtype=torch.long))
    for pos in (0, 3, 29):
        assert torch.allclose(out[:, pos], x[:, pos] * REFERENCE[layout](pos, DIMS.d_model), atol=1e-5)
    additive = make("sinusoidal", layout=layout).embed(x, torch.arange(30), None)
    assert not torch.allclose(out, additive, atol=1e-2)  # a product, not the sum
    assert not REGISTRY["multiplicative"].scale_token_embedding


def test_multiplicative_learned_starts_as_nope_then_scales_per_position():
    enc = make("multiplicative", table="learned")
    torch.manual_seed(3)
    x = torch.randn(2, 16, DIMS.d_model)
    pos = torch.arange(16)
    assert torch.equal(enc.embed(x, pos, None), x)  # table initialised to ones
    with torch.no_grad():
        enc.table.weight.normal_()
    p = enc.table.weight
    assert torch.allclose(enc.embed(x, pos, None), x * p[:16][None], atol=0)
    with pytest.raises(PositionRangeError, match="16 entries.*position 16"):
        enc.embed(torch.zeros(1, 17, DIMS.d_model), torch.arange(17), None)
    # as a whole model it starts identical to NoPE with the same weights
    nope, mult = model("nope"), model("multiplicative", table="learned")
    mult.load_state_dict({**nope.state_dict(), "encoding.table.weight": torch.ones(16, 32)})
    assert torch.equal(logits(mult, tokens(16)), logits(nope, tokens(16)))
    mult(tokens(16)[:, :-1], targets=tokens(16)[:, 1:]).backward()
    assert mult.encoding.table.weight.grad.abs().sum() > 0


# ---- RoPE pairing ---------------------------------------------------------------------------

def theta(hs=HS, base=10000.0):
    return torch.tensor([base ** (-2 * i / hs) for i in range(hs // 2)], dtype=torch.float64)


def rotate_interleaved_reference(x, positions):
    """Meta's LLaMA / RoFormer form: adjacent dims (x_{2i}, x_{2i+1}) as one complex number,
    times exp(i p theta_i). x: (..., T, hs) -> (..., T, hs), float64."""
    z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())  # (..., T, hs/2)
    angles = positions.double()[:, None] * theta()[None, :]
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def qk(T=20, seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, T, HS, generator=g), torch.randn(2, 4, T, HS, generator=g)


def test_interleaved_pairing_rotates_adjacent_dims():
    enc = make("rope", pairing="interleaved")
    q, k = qk()
    pos = torch.arange(20)
    qr, kr = enc.rotate(q, k, pos, 0)
    assert torch.allclose(qr.double(), rotate_interleaved_reference(q, pos), atol=1e-5)
    assert torch.allclose(kr.double(), rotate_interleaved_reference(k, pos), atol=1e-5)
    half_q, _ = make("rope").rotate(q, k, pos, 0)
    assert not torch.allclose(qr, half_q, atol=1e-2)  # the default pairs other dims


def half_to_interleaved_rows(weight, n_heads=4, hs=HS):
    """qkv weight (3D, D): in each head of q and k, new row 2i <- old row i, 2i+1 <- old i + hs/2."""
    out = weight.clone()
    for part in (0, 1):  # q, k; v (part 2) is unchanged
        for h in range(n_heads):
            start = part * n_heads * hs + h * hs
            for i in range(hs // 2):
                out[start + 2 * i] = weight[start + i]
                out[start + 2 * i + 1] = weight[start + i + hs // 2]
    return out


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_pairings_are_one_function_up_to_a_qk_permutation(name):
    from posbench.convert import convert_model_state, pairing_permutation

    half = model(name, scale_base=16.0) if name == "xpos" else model(name)
    with torch.no_grad():  # sharper attention than at init, so the positions matter in the logits
        for block in half.blocks:
            block.attn.qkv.weight.normal_(std=0.5)
    interleaved = model(name, pairing="interleaved", **({"scale_base": 16.0} if name == "xpos" else {}))
    state = half.state_dict()
    permuted = {**state, **{f"blocks.{i}.attn.qkv.weight": half_to_interleaved_rows(state[f"blocks.{i}.attn.qkv.weight"])
                            for i in range(2)}}
    x = tokens(40)
    interleaved.load_state_dict(permuted)
    reference = logits(half, x)
    assert torch.allclose(logits(interleaved, x), reference, atol=1e-5)
    interleaved.load_state_dict(state)  # same weights, other pairing: another function
    assert (logits(interleaved, x) - reference).abs().max() > 1e-2
    # posbench.convert applies exactly this permutation, and back again
    perm = pairing_permutation(HS, "half", "interleaved")
    assert all(torch.equal(convert_model_state(state, 2, 4, perm)[key], permuted[key]) for key in state)
    back = convert_model_state(permuted, 2, 4, pairing_permutation(HS, "interleaved", "half"))
    assert all(torch.equal(back[key], state[key]) for key in state)


def test_convert_command_gives_the_same_perplexities_and_training_resumes_alike(tmp_path, capsys, monkeypatch):
    """Stop a 12-step run at its step-6 checkpoint, convert it to the interleaved pairing,
    evaluate both at the same lengths, then let both finish: AdamW's moments were permuted with
    the weights, so the two runs stay one function to the end."""
    from posbench.train import loop as train_module
    from posbench.convert import convert_run
    from posbench.eval.ladder import evaluate
    from posbench.eval.token_nll import read_token_nll
    from posbench.train.configure import train_config
    from posbench.train.loop import train

    common = [*SMOKE, "encoding=rope", "train.steps=12", "train.ckpt_every=6", "eval.lengths=[32,128]"]  # SMOKE: narrow
    cfg, cfg_interleaved = compose(*common), compose(*common, "encoding.pairing=interleaved")
    run, out = tmp_path / "half", tmp_path / "interleaved"
    real_save = train_module.save_checkpoint

    def save_then_stop(path, state):
        real_save(path, state)
        if state["step"] == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train(train_config(cfg), run)
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)

    main(["convert", str(run), "--pairing", "interleaved", "--out", str(out)])
    assert f"wrote {out}" in capsys.readouterr().out
    assert OmegaConf.load(out / "config.yaml").encoding.pairing == "interleaved"

    def evaluated(run_dir):
        return evaluate(OmegaConf.create({"checkpoint": str(run_dir), "eval": cfg.eval, "device": "cpu"}))

    before, after = evaluated(run), evaluated(out)
    assert after.ppl.tolist() == pytest.approx(before.ppl.tolist(), rel=1e-5)
    assert after.eval_len.tolist() == [32, 128] and (after.status == "ok").all()
    # the weights moved, AdamW's moments moved with them
    old, new = (torch.load(d / "checkpoints/last.pt", weights_only=False) for d in (run, out))
    assert not torch.equal(old["model"]["blocks.0.attn.qkv.weight"], new["model"]["blocks.0.attn.qkv.weight"])
    old_m, new_m = (s["optimizer"]["state"] for s in (old, new))
    moved = [i for i in old_m if not torch.equal(old_m[i]["exp_avg"], new_m[i]["exp_avg"])]
    assert len(moved) == 2  # the two layers' qkv weights
    assert new["config_hash"] != old["config_hash"] and new["step"] == old["step"] == 6
    # the step-6 weights read with the new pairing (no permutation) score differently, token by token:
    # 200x the converted run's mean gap (6 steps from the init, whole-split perplexities differ only
    # in their 6th digit, too close to the converted run's float noise to tell apart)
    unconverted = tmp_path / "unconverted"
    convert_run(out, "interleaved", unconverted)  # a copy of the converted run...
    torch.save({**torch.load(unconverted / "checkpoints/last.pt", weights_only=False), "model": old["model"]},
               unconverted / "checkpoints/last.pt")  # ...holding the unpermuted weights
    evaluated(unconverted)
    b, a, w = (read_token_nll(d / "token_nll.npz") for d in (run, out, unconverted))
    assert b.keys() == a.keys() == w.keys() and len(b) == 2
    for key in b:
        assert np.abs(a[key] - b[key]).mean() * 10 < np.abs(w[key] - b[key]).mean()
    # both runs resume from step 6 (the converted one under its own config) and end alike
    finished = train(train_config(cfg), run).rows.ppl.tolist()
    assert train(train_config(cfg_interleaved), out).rows.ppl.tolist() == pytest.approx(finished, rel=1e-5)
    # errors: an existing out dir, a non-rotary run
    with pytest.raises(PosbenchError, match="exists and is not empty"):
        convert_run(run, "interleaved", out)
    alibi = tmp_path / "alibi"
    convert_run(run, "half", alibi)
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(alibi / "config.yaml"), {"encoding": {"name": "alibi"}}),
                   alibi / "config.yaml")
    with pytest.raises(PosbenchError, match=r"convert changes the RoPE pairing of a rotary run \([a-z_, ]*\brope, [a-z_, ]*xpos\)"):
        convert_run(alibi, "interleaved", tmp_path / "x")


# ---- Shaw clipping distance -----------------------------------------------------------------

@pytest.mark.parametrize("k_clip", [2, 64])
def test_shaw_clipping_distance(k_clip):
    """a^K_ij = w^K_clip(j - i, k): with k = 2 every key 2 or more tokens back reads one vector;
    with k = 64 (past this sequence) every offset has its own."""
    enc, T = make("shaw", max_distance=k_clip), 24
    assert enc.key_table.shape == (2, k_clip + 1, HS)
    q, k = qk(T)
    pos = torch.arange(T)
    with torch.no_grad():
        s = enc.score(q, k, pos, pos, layer=1)  # (B, H, T, T): q_i . a^K_ij
    i = T - 1
    for j in range(i + 1):
        expected = q[:, :, i] @ enc.key_table[1, min(i - j, k_clip)]
        assert torch.allclose(s[:, :, i, j], expected, atol=1e-6)
    row = s[:, :, i, : i + 1]  # offsets i - j = i .. 0
    distinct = {round(v, 5) for v in row[0, 0].tolist()}
    assert len(distinct) == (k_clip + 1 if k_clip < T else T)
    # value side: all attention on the key at offset d gives w^V_min(d, k)
    for d in (0, 1, 2, 5, 23):
        probs = torch.zeros(1, 4, T, T)
        probs[..., i, i - d] = 1.0
        out = enc.value(probs, pos, pos, 1)[0, :, i]
        assert torch.allclose(out, enc.value_table[1, min(d, k_clip)].expand(4, HS), atol=1e-6)
    m = model("shaw", chunk=8, max_distance=k_clip)
    assert torch.isfinite(logits(m, tokens(64))).all()  # 4x train_len, chunked kernel


# ---- ALiBi ----------------------------------------------------------------------------------

SLOPES = [2.0 ** (-8 / 4 * (h + 1)) for h in range(4)]  # paper: 2^(-8/H), ratio 2^(-8/H)


def test_alibi_symmetric_is_minus_slope_times_abs_distance():
    T = 12
    sym, causal = (make("alibi", form=f).bias(torch.arange(T), torch.arange(T), 0) for f in ("symmetric", "causal"))
    for h in range(4):
        for i in range(T):
            for j in range(T):
                assert sym[h, i, j].item() == pytest.approx(-SLOPES[h] * abs(i - j))
                assert causal[h, i, j].item() == pytest.approx(-SLOPES[h] * (i - j))
    lower = torch.ones(T, T).tril().bool()
    assert torch.equal(sym[:, lower], causal[:, lower]) and not torch.allclose(sym[:, ~lower], causal[:, ~lower])


@pytest.mark.parametrize("chunk", [1024, 7])  # bias cached for the whole sequence / rebuilt per query chunk
def test_alibi_forms_give_the_same_outputs_under_the_causal_mask(chunk):
    x = tokens(30)
    causal, symmetric = model("alibi", chunk=chunk), model("alibi", chunk=chunk, form="symmetric")
    symmetric.load_state_dict(causal.state_dict())
    assert torch.allclose(logits(causal, x), logits(symmetric, x), atol=1e-6)


def test_alibi_learned_slopes_start_at_the_paper_slopes_and_train():
    enc = make("alibi", learned_slopes=True)
    assert torch.allclose(enc.slopes, torch.tensor(SLOPES), rtol=1e-6)
    assert [n for n, _ in enc.named_parameters()] == ["log_slopes"]
    assert list(make("alibi").parameters()) == []  # the default stays parameter-free
    m = model("alibi", learned_slopes=True)
    before = logits(model("alibi"), tokens())
    assert torch.allclose(logits(m, tokens()), before, atol=1e-5)  # same function at init
    m(tokens()[:, :-1], targets=tokens()[:, 1:]).backward()
    grad = m.encoding.log_slopes.grad
    assert grad is not None and torch.isfinite(grad).all() and (grad != 0).all()
    with torch.no_grad():
        m.encoding.log_slopes.copy_(torch.log(torch.tensor([0.9, 0.3, 0.2, 0.01])))
    bias = m.encoding.bias(torch.arange(5), torch.arange(5), 0)
    assert bias[:, 4, 1].tolist() == pytest.approx([-0.9 * 3, -0.3 * 3, -0.2 * 3, -0.01 * 3], rel=1e-5)


# ---- T5: bucket options, per-layer vs shared ------------------------------------------------

def t5_bucket_reference(n, num_buckets, max_distance):
    n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return n
    return min(num_buckets - 1, exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)))


@pytest.mark.parametrize("per_layer", [False, True])
def test_t5_bucket_options_and_per_layer_tables(per_layer):
    enc = make("t5", num_buckets=8, max_distance=16, per_layer=per_layer)
    T = 40
    biases = [enc.bias(torch.arange(T), torch.arange(T), layer) for layer in range(2)]
    tables = [enc.tables[layer] if per_layer else enc.table for layer in range(2)]
    for layer in range(2):
        for i, j in [(0, 0), (5, 2), (9, 0), (20, 3), (39, 0)]:
            bucket = t5_bucket_reference(i - j, 8, 16)
            # x-transformers' RelativePositionBias: sqrt(head_dim) * table[bucket]
            assert torch.allclose(biases[layer][:, i, j], math.sqrt(HS) * tables[layer].weight[bucket])
    if per_layer:
        assert not torch.allclose(biases[0], biases[1]) and enc.layer_invariant_bias is False
    else:
        assert torch.equal(biases[0], biases[1]) and enc.layer_invariant_bias is True
    assert REGISTRY["t5"].layer_invariant_bias is True  # the class default is untouched


def test_t5_per_layer_bias_reaches_every_layer():
    """Whole-sequence attention (one bias built per forward and cached when layer-invariant)
    equals per-chunk attention (bias rebuilt in each layer): the kernel did not reuse layer 0's."""
    x = tokens(30)
    whole, chunked = model("t5", per_layer=True), model("t5", chunk=7, per_layer=True)
    chunked.load_state_dict(whole.state_dict())
    assert torch.allclose(logits(whole, x), logits(chunked, x), atol=1e-5)
    # per-layer tables that are all equal to the shared one give the shared model
    shared = model("t5")
    state = {k: v for k, v in whole.state_dict().items() if not k.startswith("encoding.")}
    shared.load_state_dict({**state, "encoding.table.weight": whole.encoding.tables[0].weight})
    with torch.no_grad():
        for table in whole.encoding.tables:
            table.weight.copy_(whole.encoding.tables[0].weight)
    assert torch.allclose(logits(whole, x), logits(shared, x), atol=1e-6)
    with torch.no_grad():
        whole.encoding.tables[1].weight.mul_(-50)  # a different bias in layer 1 only
    assert not torch.allclose(logits(whole, x), logits(shared, x), atol=1e-3)


def test_kernels_agree_for_every_variant():
    """Chunked kernels match plain fp32 attention for each non-default option too."""
    from posbench.model.attention import reference_attention

    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 21, HS) for _ in range(3))
    pos = torch.arange(21)
    for name, params in [("alibi", {"form": "symmetric"}), ("alibi", {"learned_slopes": True}),
                         ("t5", {"per_layer": True}), ("shaw", {"max_distance": 2})]:
        enc = make(name, **params)
        for layer in range(2):
            out = causal_attention(q, k, v, enc, pos, layer, chunk_size=5)
            assert torch.allclose(out, reference_attention(q, k, v, enc, pos, layer), atol=1e-5), (name, params)
