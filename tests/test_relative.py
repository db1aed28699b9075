"""Content-dependent relative encodings (Shaw, Transformer-XL, DeBERTa, TENER, CoPE) against
brute-force loops over (i, j) of each paper's formula, written here independently."""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from posbench.model.attention import causal_attention
from posbench.encodings import ModelDims, build_encoding
from posbench.model.transformer import LanguageModel, ModelConfig

DIMS = ModelDims(d_model=16, n_heads=2, n_layers=2, train_len=8)  # head_dim 8
HS = DIMS.head_dim
NAMES = ["shaw", "xl", "deberta", "tener", "cope"]


def make(name, **params):
    torch.manual_seed(0)
    return build_encoding({"name": name, **params}, DIMS)


def qkv(T, B=2, seed=1):
    torch.manual_seed(seed)
    return (torch.randn(B, DIMS.n_heads, T, HS) for _ in range(3))


def sinusoid(t, dim):
    """[sin(t c_0), cos(t c_0), sin(t c_1), cos(t c_1), ...], c_m = 10000^(-2m/dim): TENER's R_t;
    for Transformer-XL any fixed layout of the sinusoids is absorbed by W_R, this is the one used."""
    out = []
    for m in range(dim // 2):
        angle = t / 10000 ** (2 * m / dim)
        out += [math.sin(angle), math.cos(angle)]
    return torch.tensor(out)


def dot(a, b):
    return (a * b).sum(-1)  # batched over leading dims


def attend(logits_row, values_row):
    """One query's softmax over its keys j <= i and weighted sum of per-key vectors."""
    weights = torch.softmax(torch.stack(logits_row), dim=0)
    return sum(w * v for w, v in zip(weights, values_row))


def score_plus_content(enc, q, k, layer):
    pos = torch.arange(q.shape[2])
    return q @ k.transpose(-2, -1) + enc.score(q, k, pos, pos, layer)


# ---- Shaw et al. 2018 ---------------------------------------------------------------

def test_shaw_matches_loop_of_e_ij_and_z_i():
    """e_ij = q_i (k_j + a^K_ij)^T / sqrt(d), z_i = sum_j a_ij (v_j + a^V_ij),
    a_ij = w_clip(j - i, k) with clip(x, k) = max(-k, min(k, x))."""
    k_clip, layer, T = 3, 1, 10
    enc = make("shaw", max_distance=k_clip)
    q, k, v = qkv(T)
    out = causal_attention(q, k, v, enc, torch.arange(T), layer, chunk_size=4)

    def w(table, offset):  # table row r holds offset -r; causal offsets are <= 0
        clipped = max(-k_clip, min(k_clip, offset))
        return table[layer][-clipped]

    for b in range(2):
        for h in range(2):
            for i in range(T):
                e = [q[b, h, i] @ (k[b, h, j] + w(enc.key_table, j - i)) / math.sqrt(HS) for j in range(i + 1)]
                z = attend(e, [v[b, h, j] + w(enc.value_table, j - i) for j in range(i + 1)])
                assert torch.allclose(out[b, h, i], z, atol=1e-5)


def test_shaw_offsets_beyond_k_share_one_embedding():
    enc = make("shaw", max_distance=4)
    q, k, _ = qkv(20)
    s = enc.score(q, k, torch.arange(20), torch.arange(20), layer=0)  # q_i . a^K_ij
    far = q[:, :, 19] @ enc.key_table[0, 4]  # offset -4 = -k
    for j in range(0, 16):  # offsets -19 .. -4 all clip to -k
        assert torch.allclose(s[:, :, 19, j], far, atol=1e-6)
    assert not torch.allclose(s[:, :, 19, 16], far)  # offset -3 has its own vector
    # value side: all weight on keys beyond k gives exactly w^V_{-k}
    probs = torch.zeros(1, 2, 20, 20)
    probs[:, :, 19, :10] = 0.1
    assert torch.allclose(enc.value(probs, torch.arange(20), torch.arange(20), 0)[0, :, 19],
                          enc.value_table[0, 4].expand(2, HS), atol=1e-6)


# ---- Transformer-XL (Dai et al. 2019) -------------------------------------------------

def test_xl_matches_loop_of_four_terms():
    """A_ij = q_i k_j + q_i W_R R_{i-j} + u k_j + v W_R R_{i-j}, per head."""
    enc, layer, T = make("xl"), 1, 9
    q, k, _ = qkv(T)
    got = score_plus_content(enc, q, k, layer)
    W = enc.r_proj[layer].weight  # (D, D): W_R R = W @ R
    for i in range(T):
        for j in range(i + 1):
            WR = (W @ sinusoid(i - j, DIMS.d_model)).view(DIMS.n_heads, HS)
            for h in range(2):
                u, v = enc.u[h], enc.v[h]
                A = dot(q[:, h, i], k[:, h, j]) + dot(q[:, h, i], WR[h]) + dot(u, k[:, h, j]) + dot(v, WR[h])
                assert torch.allclose(got[:, h, i, j], A, atol=1e-5)
    assert enc.logit_scale() == pytest.approx(HS ** -0.5)


# ---- TENER (Yan et al. 2019) ----------------------------------------------------------

def test_tener_matches_loop_and_is_unscaled():
    """A_tj = Q_t K_j + Q_t R_{t-j} + u K_j + v R_{t-j}, R unprojected, d_k wide."""
    enc, layer, T = make("tener"), 1, 9
    q, k, _ = qkv(T)
    got = score_plus_content(enc, q, k, layer)
    for i in range(T):
        for j in range(i + 1):
            R = sinusoid(i - j, HS)
            for h in range(2):
                u, v = enc.u[layer, h], enc.v[layer, h]
                A = dot(q[:, h, i], k[:, h, j]) + dot(q[:, h, i], R) + dot(u, k[:, h, j]) + dot(v, R)
                assert torch.allclose(got[:, h, i, j], A, atol=1e-5)
    assert enc.logit_scale() == 1.0
    assert make("tener", scaled=True).logit_scale() == pytest.approx(HS ** -0.5)


def test_tener_is_direction_aware():
    """R_{-t} flips the sin entries and keeps the cos entries: the score tells i - j = t
    from i - j = -t, which sinusoids of |i - j| cannot."""
    enc = make("tener")
    with torch.no_grad():
        enc.u.zero_()
        enc.v.zero_()
    k = torch.zeros(1, 2, 2, HS)
    q_pos, k_pos = torch.tensor([10]), torch.tensor([7, 13])  # i - j = +3, -3
    for m in range(HS // 2):
        sin_q, cos_q = torch.zeros(1, 2, 1, HS), torch.zeros(1, 2, 1, HS)
        sin_q[..., 2 * m], cos_q[..., 2 * m + 1] = 1.0, 1.0
        s = enc.score(sin_q, k, q_pos, k_pos, 0)[0, 0, 0]  # (R_3[2m], R_-3[2m])
        c = enc.score(cos_q, k, q_pos, k_pos, 0)[0, 0, 0]
        angle = 3 / 10000 ** (2 * m / HS)
        assert torch.allclose(s, torch.tensor([math.sin(angle), -math.sin(angle)]), atol=1e-6)
        assert torch.allclose(c, torch.tensor([math.cos(angle), math.cos(angle)]), atol=1e-6)
        assert s[0] != s[1]


# ---- DeBERTa (He et al. 2021) ---------------------------------------------------------

def test_deberta_matches_loop_of_c2c_c2p_p2c_over_sqrt_3d():
    k_clip, layer, T = 3, 1, 10
    enc = make("deberta", max_distance=k_clip)
    q, k, v = qkv(T)
    out = causal_attention(q, k, v, enc, torch.arange(T), layer, chunk_size=4)

    def delta(i, j):
        if i - j <= -k_clip:
            return 0
        if i - j >= k_clip:
            return 2 * k_clip - 1
        return i - j + k_clip

    P = enc.rel_embeddings  # (2k, D), shared by layers
    Kr = (P @ enc.pos_key[layer].weight.T).view(2 * k_clip, 2, HS)
    Qr = (P @ enc.pos_query[layer].weight.T).view(2 * k_clip, 2, HS)
    for b in range(2):
        for h in range(2):
            for i in range(T):
                A = [(q[b, h, i] @ k[b, h, j] + q[b, h, i] @ Kr[delta(i, j), h]
                      + k[b, h, j] @ Qr[delta(j, i), h]) / math.sqrt(3 * HS) for j in range(i + 1)]
                assert torch.allclose(out[b, h, i], attend(A, list(v[b, h, : i + 1])), atol=1e-5)


# ---- CoPE (Golovneva et al. 2024) -----------------------------------------------------

def gated_qk(query_sign, key_sign, T, strength=1000.0):
    """q_i = strength * s_i e_0, k_j = sigma_j e_0: gate sigmoid(q_i.k_j / sqrt(d)) is 1 when
    s_i sigma_j > 0, 0 when < 0, 1/2 when sigma_j = 0."""
    q, k = torch.zeros(1, 1, T, HS), torch.zeros(1, 1, T, HS)
    q[0, 0, :, 0] = strength * torch.tensor(query_sign, dtype=torch.float32)
    k[0, 0, :, 0] = torch.tensor(key_sign, dtype=torch.float32)
    return q, k


def test_cope_positions_count_open_gates():
    T = 12
    query_sign = [1, -1, 1, 1, -1, 1, 1, 1, -1, 1, -1, 1]
    key_sign = [1, 1, -1, 1, -1, -1, 1, 1, 1, -1, 1, 1]
    q, k = gated_qk(query_sign, key_sign, T)
    pos = torch.arange(T)
    for max_pos in (64, 3):
        p = make("cope", max_pos=max_pos).positions(q, k, pos, pos)[0, 0]
        for i in range(T):
            for j in range(i + 1):
                count = sum(query_sign[i] * key_sign[t] > 0 for t in range(j, i + 1))
                assert p[i, j].item() == min(count, max_pos)


def test_cope_interpolates_at_half_open_gates():
    """sigma_j = 0 opens a gate halfway: p = n + 1/2 and the logit is (z[n] + z[n+1]) / 2."""
    T = 8
    key_sign = [0, 1, 0, 0, 1, -1, 0, 1]
    q, k = gated_qk([1] * T, key_sign, T)
    enc, pos = make("cope"), torch.arange(T)
    s = enc.score(q, k, pos, pos, layer=1)[0, 0]
    z = q[0, 0] @ enc.pos_emb[1].T  # (T, p_max + 1): q_i . e[n]
    fractions = set()
    for i in range(T):
        for j in range(i + 1):
            p = sum(1.0 if key_sign[t] > 0 else 0.5 if key_sign[t] == 0 else 0.0 for t in range(j, i + 1))
            n, w = math.floor(p), p - math.floor(p)
            assert torch.allclose(s[i, j], (1 - w) * z[i, n] + w * z[i, math.ceil(p)], rtol=1e-5, atol=1e-3)
            fractions.add(w)
    assert fractions == {0.0, 0.5}  # both whole and half positions were checked


def test_cope_attention_matches_loop_of_paper_formula():
    """g_ij = sigmoid(q_i k_j / sqrt(d)), p_ij = min(sum_{t=j..i} g_it, p_max),
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p], a_ij = softmax(q_i (k_j + e[p_ij]) / sqrt(d)).
    Chunks of 3 queries: gates of a chunk's future keys must not count."""
    max_pos, layer, T = 4, 1, 10
    enc = make("cope", max_pos=max_pos)
    q, k, v = qkv(T)
    q = q * 3  # spread the gates over (0, 1)
    out = causal_attention(q, k, v, enc, torch.arange(T), layer, chunk_size=3)
    e = enc.pos_emb[layer]
    for b in range(2):
        for h in range(2):
            for i in range(T):
                gates = [torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(HS)) for t in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(sum(gates[j:]).item(), max_pos)
                    lo, hi = math.floor(p), math.ceil(p)
                    e_p = (p - lo) * e[hi] + (1 - p + lo) * e[lo]
                    logits.append(q[b, h, i] @ (k[b, h, j] + e_p) / math.sqrt(HS))
                assert torch.allclose(out[b, h, i], attend(logits, list(v[b, h, : i + 1])), atol=1e-5)


# ---- all five -------------------------------------------------------------------------


class LargestTensor(TorchFunctionMode):
    """Records the largest tensor any torch call returns."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.numel = max(self.numel, out.numel())
        return out


@pytest.mark.parametrize("name", NAMES)
def test_runs_at_sixteen_times_train_length_in_linear_memory(name):
    """train_len 128 -> 2048 tokens, d_model 256, 8 heads, 4 layers, query chunks of 1024.
    Memory stays linear in length per chunk: no tensor beyond 2 x (B, H, chunk, T) entries
    (TENER's signed offsets need 1.5x), while one (chunk, T, head_dim) tensor, even for a
    single head, would hold twice that. Measured by size, not RSS, so it is deterministic."""
    torch.manual_seed(0)
    mcfg = ModelConfig(d_model=256, n_layers=4, n_heads=8, d_ff=1024, attn_chunk=1024)
    model = LanguageModel(mcfg, 64, build_encoding({"name": name}, LanguageModel.dims(mcfg, 128, 64))).eval()
    x = torch.randint(0, 64, (1, 2048))
    largest = LargestTensor()
    with torch.no_grad(), largest:
        logits = model(x)
    assert logits.shape == (1, 2048, 64) and torch.isfinite(logits).all()
    assert largest.numel <= 2 * 8 * 1024 * 2048
