"""Gemma 3 on posbench's pretrained adapter (posbench.model.pretrained): a rotary embedding per layer
type (sliding-window layers with base 10k, global layers with base 1M), each RoPE scaling applied per
type as transformers applies a ``rope_scaling``, and the window's BOS policy. A tiny random Gemma 3
is built here; nothing is downloaded."""

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from posbench.encodings.extension import Extension  # noqa: E402
from posbench.errors import PosbenchError  # noqa: E402
from posbench.methods import ntk_base  # noqa: E402
from posbench.model.pretrained import PretrainedLM, scaled_inv_freq, scaled_layer_types  # noqa: E402

CONTEXT, HEAD_DIM, WINDOW = 64, 16, 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
BOS = 2


def gemma_config(**scaling) -> "transformers.Gemma3TextConfig":
    """A tiny Gemma 3 text config: 3 layers (sliding, full, sliding), a window of 8, a context of
    64, logits soft-capped (as Gemma 2; Gemma 3 leaves them uncapped) so the adapter's head is
    checked against the model's own; ``scaling``: a ``rope_scaling`` as transformers takes it."""
    return transformers.Gemma3TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM,
        max_position_embeddings=CONTEXT, sliding_window=WINDOW, layer_types=list(LAYER_TYPES),
        final_logit_softcapping=30.0, bos_token_id=BOS, **({"rope_scaling": scaling} if scaling else {}))


@pytest.fixture(scope="module")
def gemma():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(gemma_config()).eval()


def reference_rotary(kind: str, s: float):
    """transformers' own Gemma 3 rotary module for posbench's scaling ``kind`` at s, the scaling
    given to the config as transformers takes a ``rope_scaling`` (which decides the layer types it
    acts on). NTK, which transformers lacks, is the default rope with the NTK-aware base of the
    global layers."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    if kind == "ntk":
        config = gemma_config()
        config.rope_parameters["full_attention"]["rope_theta"] = ntk_base(1e6, s, HEAD_DIM)
    else:
        scalings = {"pi": {"rope_type": "linear", "factor": s},
                    "yarn": {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": CONTEXT},
                    "dynamic_ntk": {"rope_type": "dynamic", "factor": 1.0},
                    "llama3": {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": CONTEXT,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0}}
        config = gemma_config(**scalings[kind])
    return Gemma3RotaryEmbedding(config)


def test_a_scaling_acts_on_the_layer_types_transformers_applies_a_rope_scaling_to(gemma):
    assert scaled_layer_types(gemma.config) == ("full_attention",)
    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    assert wrapped.encoding.name == "rope" and wrapped.encoding.train_len == CONTEXT
    assert set(wrapped.encoding.layer_types) == {"sliding_attention", "full_attention"}


@pytest.mark.parametrize("kind", ["pi", "ntk", "dynamic_ntk", "yarn", "llama3"])
def test_scaled_frequencies_per_layer_type_equal_transformers_own(gemma, kind):
    """At a window of 4x the context (s = 4): posbench's scaling of the global layers' frequencies
    (scaled_inv_freq, the class every rotary run uses) equals the inverse frequencies and attention
    factor transformers' Gemma 3 rotary module computes for the scaled config, and what the
    model's rotary module gives each layer type during the adapter's forward pass equals the
    reference's (the sliding layers their trained ones); the buffers are restored after."""
    length, s = 4 * CONTEXT, 4.0
    reference = reference_rotary(kind, s)
    positions = torch.arange(length)[None]
    x = torch.zeros(1, length, 32)
    expected = {t: reference(x, positions, t) for t in ("sliding_attention", "full_attention")}  # (cos, sin)
    # after the forward pass: dynamic NTK has recomputed its frequencies for the length
    inv_freq, attention = scaled_inv_freq(gemma.config, kind, s, CONTEXT, "full_attention")
    torch.testing.assert_close(inv_freq, reference.full_attention_inv_freq)
    assert attention == pytest.approx(reference.full_attention_attention_scaling)

    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    rotary = gemma.model.rotary_emb
    before = {t: getattr(rotary, f"{t}_inv_freq").clone() for t in expected}
    seen = {}
    hook = rotary.register_forward_hook(lambda m, args, out: seen.__setitem__(args[2], out))
    try:
        with wrapped.encoding.scaled(kind, None), torch.no_grad():
            wrapped.hidden(torch.randint(3, 96, (1, length)))
    finally:
        hook.remove()
    for t, (cos, sin) in expected.items():
        torch.testing.assert_close(seen[t][0], cos)
        torch.testing.assert_close(seen[t][1], sin)
        torch.testing.assert_close(getattr(rotary, f"{t}_inv_freq"), before[t])
    assert rotary.full_attention_attention_scaling == 1.0


def test_logits_under_no_scaling_equal_transformers_forward(gemma):
    """Past the sliding window (40 tokens, window 8): the adapter's logits, and its per-token NLL
    from the body's hidden states and its own head, equal transformers' forward."""
    ids = torch.randint(3, 96, (2, 40))
    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    with torch.no_grad():
        logits = gemma(input_ids=ids).logits
        torch.testing.assert_close(wrapped(ids), logits)
        nll = wrapped.head_nll(wrapped.hidden(ids[:, :-1]), ids[:, 1:])
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 96), ids[:, 1:].reshape(-1), reduction="none")
    torch.testing.assert_close(nll, expected.view(2, 39))


def test_bos_on_every_window_puts_it_before_each_window_that_lacks_it(gemma):
    """bos=every: a window not beginning with BOS is the model's forward of [BOS] + window with
    BOS's output dropped; one beginning with BOS runs as it is; bos=first leaves every window
    as it is. The name of every's rows says so."""
    ids = torch.randint(3, 96, (3, 20))
    ids[1, 0] = BOS
    every = PretrainedLM(gemma, "tiny-gemma", "test", bos="every")
    assert every.name == "tiny-gemma+bos" and PretrainedLM(gemma, "tiny-gemma", "test").name == "tiny-gemma"
    with torch.no_grad():
        prefixed = gemma(input_ids=torch.cat([torch.full((3, 1), BOS), ids], 1)).logits[:, 1:]
        plain = gemma(input_ids=ids).logits
        got = every(ids)
        torch.testing.assert_close(got[[0, 2]], prefixed[[0, 2]])
        torch.testing.assert_close(got[1], plain[1])
        hidden = every.hidden(ids)
        body = gemma.model(input_ids=torch.cat([torch.full((3, 1), BOS), ids], 1)).last_hidden_state[:, 1:]
        torch.testing.assert_close(hidden[0], body[0])
        torch.testing.assert_close(PretrainedLM(gemma, "tiny-gemma", "test")(ids), plain)
    with pytest.raises(PosbenchError, match="valid: first, every"):
        PretrainedLM(gemma, "tiny-gemma", "test", bos="always")


def test_answer_logits_equal_the_model_s_own_at_the_answer_positions(gemma):
    """A probe's answer logits from the adapter's body and soft-capped head at the last positions
    alone equal transformers' forward there, BOS at every window included."""
    from posbench.eval.passkey import answer_logits

    ids = torch.randint(3, 96, (2, 40))
    every = PretrainedLM(gemma, "tiny-gemma", "test", bos="every")
    with torch.no_grad():
        full = gemma(input_ids=torch.cat([torch.full((2, 1), BOS), ids], 1)).logits[:, 1:]
        got = answer_logits(every, ids, 36)
    assert got.shape == (2, 4, 96)
    torch.testing.assert_close(got, full[:, 36:])


def test_bos_on_every_window_scales_by_the_window_s_own_length(gemma):
    """The BOS before a window is not counted in its length: at 4x the context PI's factor is 4."""
    every = PretrainedLM(gemma, "tiny-gemma", "test", bos="every")
    reference = reference_rotary("pi", 4.0)
    seen = {}
    rotary = gemma.model.rotary_emb
    hook = rotary.register_forward_hook(lambda m, args, out: seen.__setitem__(args[2], out))
    try:
        with every.encoding.scaled("pi", None), torch.no_grad():
            every.hidden(torch.randint(3, 96, (1, 4 * CONTEXT)))
    finally:
        hook.remove()
    positions = torch.arange(4 * CONTEXT + 1)[None]  # BOS at 0, the window at 1 .. 256
    cos, _ = reference(torch.zeros(1, 1, 32), positions, "full_attention")
    torch.testing.assert_close(seen["full_attention"][0], cos)


def by_definition(model, ext):
    """An attention function for ``model`` under ``ext`` written from the definitions: a global
    layer's logits from :func:`direct_logits` on its q and k as they leave q_norm and k_norm (before
    any rotation) with the global layers' frequencies; a sliding layer's from its rotated q and k
    with an explicit band mask of WINDOW keys. -> (register it, the hooks to remove)."""
    from posbench.encodings.extension import direct_logits

    unrotated, hooks = {}, []
    for layer in model.model.layers:
        a = layer.self_attn
        hooks.append(a.q_norm.register_forward_hook(lambda m, i, out, a=a: unrotated.__setitem__((a, "q"), out)))
        hooks.append(a.k_norm.register_forward_hook(lambda m, i, out, a=a: unrotated.__setitem__((a, "k"), out)))
    inv_freq = model.model.rotary_emb.full_attention_inv_freq.float()

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, sliding_window=None, **kwargs):
        T, rep = query.shape[2], query.shape[1] // key.shape[1]
        i, j = torch.arange(T)[:, None], torch.arange(T)[None]
        if sliding_window:
            logits = (query @ key.repeat_interleave(rep, 1).transpose(-1, -2)) * scaling
            logits = logits.masked_fill((j > i) | (i - j >= sliding_window), float("-inf"))
        else:
            q, k = unrotated[(module, "q")], unrotated[(module, "k")].repeat_interleave(rep, 1)
            logits = torch.stack([direct_logits(q[b], k[b], inv_freq, ext) for b in range(q.shape[0])]) * scaling
            logits = logits.masked_fill(j > i, float("-inf"))
        out = logits.softmax(-1) @ value.repeat_interleave(rep, 1).float()
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attention, hooks


@pytest.mark.parametrize("ext", [Extension("sinks", 20, 2, CONTEXT), Extension("lm_infinite", 24, 3, CONTEXT),
                                 Extension("dca", 24, 4, CONTEXT), Extension("string", 20, 5, CONTEXT),
                                 Extension("self_extend", 16, 4, CONTEXT), Extension("rerope", 16, None, CONTEXT),
                                 Extension("llama3", train_len=CONTEXT), Extension("logn", train_len=CONTEXT)],
                         ids=lambda e: e.method)
def test_an_extension_acts_on_the_global_layers_and_leaves_the_sliding_ones_as_trained(gemma, ext):
    """Gemma's logits under each method through the adapter (sliding layers windowed in chunks,
    global layers under the method) equal the model run with an attention written from the
    definitions, and differ from the model as trained; the implementation is restored after."""
    from posbench.model.pretrained import attention_implementation

    ids = torch.randint(3, 96, (2, 2 * CONTEXT), generator=torch.Generator().manual_seed(3))
    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    before = gemma.config._attn_implementation
    attention, hooks = by_definition(gemma, ext)
    try:
        with torch.no_grad():
            plain = wrapped(ids)
            with wrapped.encoding.extended(ext):
                got = wrapped(ids)
            assert gemma.config._attn_implementation == before
            with attention_implementation(gemma.config, "by_definition", attention):
                want = gemma(input_ids=ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-3)


def test_an_extension_is_refused_where_logits_are_soft_capped(gemma):
    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    wrapped.encoding.check_extension(Extension("none"))
    wrapped.encoding.check_extension(Extension("sinks", train_len=CONTEXT))
    gemma.config.attn_logit_softcapping = 50.0
    try:
        with pytest.raises(PosbenchError, match="this model caps its attention logits at 50.0; valid: eval.extension=none"):
            wrapped.encoding.check_extension(Extension("logn", train_len=CONTEXT))
    finally:
        gemma.config.attn_logit_softcapping = None


def test_sliding_layers_attend_in_chunks_without_a_full_mask(gemma, monkeypatch):
    """The adapter's windowed attention (chunks of 16 queries here, window 8, 40 tokens): the same
    logits as transformers' own forward, no attention mask larger than a chunk's rows by its
    window's keys, and the model's attention implementation restored afterwards."""
    import posbench.model.pretrained as pretrained

    monkeypatch.setattr(pretrained, "WINDOW_ROWS", 16)
    ids = torch.randint(3, 96, (2, 40))
    wrapped = PretrainedLM(gemma, "tiny-gemma", "test")
    assert wrapped.windowed
    before = gemma.config._attn_implementation
    with torch.no_grad():
        expected = gemma(input_ids=ids).logits
        masks, sdpa = [], F.scaled_dot_product_attention

        def spy(*args, attn_mask=None, **kwargs):
            masks.append(None if attn_mask is None else tuple(attn_mask.shape))
            return sdpa(*args, attn_mask=attn_mask, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        got = wrapped(ids)
    torch.testing.assert_close(got, expected)
    assert gemma.config._attn_implementation == before
    shown = [m for m in masks if m is not None]
    assert len(shown) == 2 * 3 and max(m[-2] * m[-1] for m in shown) <= 16 * (16 + WINDOW - 1)  # 2 layers x 3 chunks
