"""Training-free extension (posbench.extension): Self-Extend, ReRoPE and log-n attention equal
their papers' definitions written pair by pair, leave a model unchanged where they should, and
run on a pretrained model through transformers' attention interface."""

import math

import pytest
import torch

from posbench.errors import PosbenchError
from posbench.extension import Extension, direct_logits, extended_attention, rotate

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
