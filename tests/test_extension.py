"""Training-free extension (posbench.encodings.extension): Self-Extend, ReRoPE and log-n attention equal
their papers' definitions written pair by pair, leave a model unchanged where they should, and
run on a pretrained model through transformers' attention interface."""

import math

import pytest
import torch

from posbench.errors import PosbenchError
from posbench.encodings.extension import Extension, direct_logits, extended_attention, rotate

T, HS, H = 23, 8, 2
INV_FREQ = 10000.0 ** (-torch.arange(0, HS, 2, dtype=torch.float32) / HS)


def reference(q, k, v, ext, scaling):
    """softmax(mask(direct logits) x scaling) v, from the pair-by-pair definition."""
    logits = direct_logits(q[0], k[0], INV_FREQ, ext) * scaling
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (logits.softmax(-1) @ v[0])[None]


@pytest.mark.parametrize("ext", [Extension("self_extend", 6, 3, 8), Extension("rerope", 5, None, 8),
                                 Extension("self_extend", 2, 2, 8), Extension("rerope", 9, None, 8),
                                 Extension("logn", None, None, 8), Extension("none", train_len=8)])
@pytest.mark.parametrize("fused", [True, False], ids=["two fused attentions", "query chunks"])
def test_chunked_attention_equals_the_definition_pair_by_pair(ext, fused):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, HS) for _ in range(3))
    out = extended_attention(q, k, v, INV_FREQ, ext, scaling=HS ** -0.5, chunk=5, fused=fused)
    torch.testing.assert_close(out, reference(q, k, v, ext, HS ** -0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", [Extension("self_extend", 4, 2, 8), Extension("rerope", 3, None, 8),
                                 Extension("logn", None, None, 8)])
@pytest.mark.parametrize("fused", [True, False], ids=["two fused attentions", "query chunks"])
def test_grouped_query_heads_attend_as_their_key_value_head_repeated(ext, fused):
    """Four query heads on two KV heads: heads 0-1 read KV head 0 and 2-3 KV head 1, as
    transformers' repeat_kv lays them out."""
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 4, T, HS), torch.randn(1, 2, T, HS), torch.randn(1, 2, T, HS)
    grouped = extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=7, fused=fused)
    repeated = extended_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), INV_FREQ, ext, HS ** -0.5)
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped[:, 2:3], reference(q[:, 2:3], k[:, 1:2], v[:, 1:2], ext, HS ** -0.5),
                               rtol=1e-5, atol=1e-5)


def test_inside_the_window_and_the_context_every_method_is_plain_rope():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, H, T, HS) for _ in range(3))
    plain = extended_attention(q, k, v, INV_FREQ, Extension("none", train_len=T), HS ** -0.5)
    for ext in (Extension("self_extend", T, 4, T), Extension("rerope", T, None, T), Extension("logn", None, None, T)):
        torch.testing.assert_close(extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5), plain)


def test_the_definitions_themselves_on_one_pair():
    """Self-Extend puts a far pair at (i // G + W - W // G, j // G); ReRoPE at distance W;
    log-n scales q by log_L(i + 1) past L."""
    torch.manual_seed(2)
    q, k = torch.randn(1, 12, HS), torch.randn(1, 12, HS)
    dot = lambda a, b: float((rotate(q[0, 11], a * INV_FREQ) * rotate(k[0, 1], b * INV_FREQ)).sum())  # noqa: E731
    assert direct_logits(q, k, INV_FREQ, Extension("self_extend", 4, 2, 8))[0, 11, 1] == pytest.approx(
        dot(11 // 2 + 4 - 2, 1 // 2), rel=1e-5)
    assert direct_logits(q, k, INV_FREQ, Extension("rerope", 4, None, 8))[0, 11, 1] == pytest.approx(dot(4, 0),
                                                                                                      rel=1e-5)
    assert direct_logits(q, k, INV_FREQ, Extension("logn", None, None, 8))[0, 11, 1] == pytest.approx(
        dot(11, 1) * math.log(12) / math.log(8), rel=1e-5)


def test_bad_extension_settings_are_one_line():
    with pytest.raises(PosbenchError, match=r"^eval.extension='yarn2' is not valid; valid choices: none, self_ext"):
        Extension("yarn2")
    with pytest.raises(PosbenchError, match=r"needs eval.extension_window > 0 .* got None"):
        Extension("rerope", None)
    with pytest.raises(PosbenchError, match=r"needs eval.extension_group > 1 .* got 1"):
        Extension("self_extend", 8, 1)


# ---- posbench's own models (eval.extension on a run) -------------------------------------------

def sharp(model):
    """Larger q, k and v than the N(0, 0.02) init, so attention is far from uniform and where a key
    sits matters."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(10)
    return model


def reference_forward(model, idx, ext, nope_layers=()):
    """The model's logits with every layer's attention from :func:`direct_logits` (the papers'
    definitions pair by pair) on RoPE's frequencies, base 10,000 over the head size, half-split
    pairs; zero frequencies (no positions) in ``nope_layers``."""
    B, T = idx.shape
    x = model.tok_emb(idx) * model.emb_scale
    for layer, block in enumerate(model.blocks):
        attn, h = block.attn, block.ln1(x)
        D, nh = h.shape[-1], attn.n_heads
        hs = D // nh
        q, k, v = attn.qkv(h).view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4)
        freq = torch.zeros(hs // 2) if layer in nope_layers else 10000.0 ** (-torch.arange(0, hs, 2).float() / hs)
        logits = direct_logits(q[0], k[0], freq, ext) * hs ** -0.5
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (logits.softmax(-1) @ v[0]).transpose(0, 1).reshape(1, T, D)
        x = x + attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return model.ln_f(x) @ model.tok_emb.weight.t()


EXTENSIONS = [Extension("self_extend", 5, 3, 8), Extension("rerope", 6, None, 8), Extension("logn", None, None, 8)]


@pytest.mark.parametrize("ext", EXTENSIONS, ids=lambda e: e.label)
@pytest.mark.parametrize("name,params,nope", [("rope", {}, ()), ("rope_nope", {"nope_every": 2}, (1, 3))],
                         ids=["rope", "rope_nope"])
def test_a_posbench_model_under_an_extension_equals_the_definition_in_every_layer(ext, name, params, nope):
    """Four layers at 3x the trained length: Self-Extend and ReRoPE regroup positions in the RoPE
    layers and leave the NoPE ones as trained; log-n scales the queries of every layer."""
    from tests.conftest import tiny_model

    model = sharp(tiny_model(name, params, n_layers=4, train_len=8))
    idx = torch.randint(0, 50, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), model.encoding.extended(ext):
        got = model(idx)
    with torch.no_grad():
        want = reference_forward(model, idx, ext, nope)
        plain = model(idx)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-3)  # it changed what it should
    assert model.encoding.extension is None  # and only within the block


@pytest.mark.parametrize("name,params", [("rope", {"pairing": "interleaved"}), ("p_rope", {"fraction": 0.5}),
                                         ("p_rope", {"form": "neox", "fraction": 0.5, "pairing": "interleaved"})],
                         ids=["rope interleaved", "p_rope", "p_rope neox interleaved"])
def test_inside_its_window_an_extension_leaves_every_rotary_form_as_trained(name, params):
    """With every distance inside W, Self-Extend and ReRoPE are the model's own rotation, in
    whichever pairing and with whichever pairs rotated: the frequencies and layout they use are
    the encoding's."""
    from tests.conftest import tiny_model

    model = sharp(tiny_model(name, params, n_layers=2, train_len=8))
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(idx)
        for ext in (Extension("self_extend", 20, 4, 8), Extension("rerope", 20, None, 8)):
            with model.encoding.extended(ext):
                torch.testing.assert_close(model(idx), plain, rtol=1e-5, atol=1e-5)
        with model.encoding.extended(Extension("rerope", 4, None, 8)):
            assert not torch.allclose(model(idx), plain, atol=1e-3)


def test_log_n_runs_on_any_encoding_and_changes_nothing_inside_the_context():
    from tests.conftest import tiny_model

    model = sharp(tiny_model("alibi", n_layers=2, train_len=8))
    idx = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = model(idx)
        with model.encoding.extended(Extension("logn", None, None, 8)):
            logn = model(idx)
    torch.testing.assert_close(logn[:, :8], plain[:, :8])  # queries 0..7: log_8(i + 1) <= 1
    assert not torch.allclose(logn[:, 8:], plain[:, 8:], atol=1e-4)


def test_an_extension_a_run_cannot_take_is_one_line():
    from posbench.config import EvalConfig
    from posbench.eval.subject import extension_of
    from tests.conftest import tiny_model

    se = Extension("self_extend", 4, 2, 8)
    with pytest.raises(PosbenchError, match=r"^eval.extension=self_extend regroups rotary positions: it runs on "
                                            r"clip_rope, hope, p_rope, resonance_rope, rope, rope_nope; this run uses 'alibi'; valid here: "
                                            r"eval.extension=none or logn$"):
        tiny_model("alibi").check_method(se)
    with pytest.raises(PosbenchError, match=r"this run uses 'xpos'"):
        tiny_model("xpos").check_method(se)
    with pytest.raises(PosbenchError, match=r"^eval.extension=rerope computes global attention without "
                                            r"model.window; this run has model.window=4"):
        tiny_model("rope", window=4).check_method(Extension("rerope", 4, None, 8))
    with pytest.raises(PosbenchError, match=r"rope_nope run has windowed RoPE layers \(window=4\)"):
        tiny_model("rope_nope", {"window": 4}).check_method(se)
    with pytest.raises(PosbenchError, match=r"^eval.extension=self_extend sets the rotary positions itself, on the "
                                            r"trained frequencies, so it takes no eval.rope_scaling \(got yarn\)"):
        extension_of(EvalConfig(rope_scaling="yarn", extension="self_extend", extension_window=4,
                                extension_group=2), 8)
    extension_of(EvalConfig(rope_scaling="yarn", extension="logn"), 8)  # log-n beside a scaling: yarn+logn


@pytest.fixture
def rope_run(smoke_rope_run_copy):
    return smoke_rope_run_copy  # the test evaluates into it


def test_posbench_eval_runs_an_extension_on_a_trained_rope_run_and_its_passkey(rope_run):
    """Rows named by the method and its parameters beside the run's own, computed once; passkey
    under the same key."""
    import pandas as pd

    from tests.conftest import posbench

    se = ["eval.extension=self_extend", "eval.extension_window=8", "eval.extension_group=4"]
    posbench("eval", f"checkpoint={rope_run}", "eval.lengths=[32,64]", *se)
    rows = pd.read_csv(rope_run / "results.csv")
    assert sorted(set(rows.rope_scaling)) == ["none", "self_extend(W=8,G=4)"]
    mine, plain = (rows[rows.rope_scaling == k].set_index("eval_len") for k in ("self_extend(W=8,G=4)", "none"))
    assert list(mine.index) == [32, 64] and (mine.status == "ok").all()
    assert (mine.ppl != plain.ppl.reindex(mine.index)).all()  # far keys regrouped: not the plain row
    again = posbench("eval", f"checkpoint={rope_run}", "eval.lengths=[32,64]", *se)
    assert "not recomputed" in again.stderr
    posbench("eval", f"checkpoint={rope_run}", "probe=passkey", "probe.lengths=[64]", "probe.depths=[0,1]",
             "probe.trials=2", *se)
    keys = pd.read_csv(rope_run / "passkey.csv")
    assert set(keys.rope_scaling) == {"self_extend(W=8,G=4)"} and set(keys.length) == {64}


def test_an_extension_an_alibi_run_cannot_take_is_one_line_and_writes_nothing(smoke_run_copy):
    from tests.conftest import posbench

    before = {p.name: p.read_bytes() for p in smoke_run_copy.iterdir() if p.is_file()}
    proc = posbench("eval", f"checkpoint={smoke_run_copy}", "eval.extension=rerope", "eval.extension_window=8",
                    check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "posbench: error: eval.extension=rerope regroups rotary positions: it runs on clip_rope, hope, p_rope, "
        "resonance_rope, rope, rope_nope; this run uses 'alibi'; valid here: eval.extension=none or logn")
    assert {p.name: p.read_bytes() for p in smoke_run_copy.iterdir() if p.is_file()} == before


def leaky_reference(q, k, v, W: int, leak: int, scaling: float):
    """Leaky ReRoPE as its reference patch (bojone/rerope, leaky_rerope_patch.py) computes it: the
    near pairs (d < W) with the trained rotation, the far ones with the query at (i + W (k - 1)) / k
    and the key at j / k (its linear-scaling embedding of factor k), one softmax over both."""
    n = q.shape[-2]
    i = torch.arange(n, dtype=torch.float64)
    freq = INV_FREQ.double()
    q, k, v = q.double(), k.double(), v.double()
    near = rotate(q, i[:, None] * freq) @ rotate(k, i[:, None] * freq).transpose(-1, -2)
    far = rotate(q, ((i + W * (leak - 1)) / leak)[:, None] * freq) @ rotate(k, (i / leak)[:, None] * freq).transpose(-1, -2)
    d = i[:, None] - i[None, :]
    logits = torch.where(d < W, near, far).masked_fill(d < 0, float("-inf")) * scaling
    return (logits.softmax(-1) @ v).float()


@pytest.mark.parametrize("W,leak", [(5, 16), (6, 3), (30, 4)])
@pytest.mark.parametrize("fused", [True, False], ids=["two fused attentions", "query chunks"])
def test_leaky_rerope_equals_its_reference_formula(W, leak, fused):
    """The last built-in method (posbench/methods/regroup.py and conf/method/leaky_rerope.yaml, nothing
    else): a far pair at the relative position W + (d - W) / k, through both kernels; at W >= T the
    model as trained; its default k is the reference's 16."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, H, T, HS) for _ in range(3))
    ext = Extension("leaky_rerope", W, leak, 8)
    assert ext.label == f"leaky_rerope(W={W},k={leak})" and ext.identity_at(W) and not ext.identity_at(W + 1)
    out = extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=5, fused=fused)
    torch.testing.assert_close(out, leaky_reference(q, k, v, W, leak, HS ** -0.5), rtol=1e-5, atol=1e-5)
    assert Extension("leaky_rerope", 5, None, 8).group == 16
    with pytest.raises(PosbenchError, match=r"^eval.extension=leaky_rerope needs a leak k > 1"):
        Extension("leaky_rerope", 5, 1, 8)
    rerope = extended_attention(q, k, v, INV_FREQ, Extension("rerope", W, None, 8), HS ** -0.5)
    assert W >= T or not torch.allclose(out, rerope, atol=1e-4)  # past the window it is not ReRoPE
