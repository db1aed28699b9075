"""xPos and RoPE scaling at inference (PI, NTK, dynamic NTK, YaRN) against values computed
here from the papers' formulas; the evaluator's scaling sweep end to end."""

import math
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import posbench, tiny_model

from posbench.config import EvalConfig
from posbench.encodings import ModelDims, build_encoding
from posbench.encodings.rotary import check_scalable, xpos_scale
from posbench.errors import PosbenchError
from posbench.eval.ladder import perplexity_ladder
from posbench.eval.results import KEY, read_results, write_results
from posbench.methods import ntk_base, yarn_attention_factor, yarn_inv_freq
from posbench.runs.rundir import RunDir

HS, TRAIN_LEN, BASE = 16, 64, 10000.0
DIMS = ModelDims(d_model=2 * HS, n_heads=2, n_layers=1, train_len=TRAIN_LEN)  # head_dim 16


def qk(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, T, HS, generator=g, dtype=torch.float64).float(), \
        torch.randn(2, 2, T, HS, generator=g, dtype=torch.float64).float()


def reference_rotate(x, positions, inv_freq, scale=1.0):
    """Rotate pairs (x_i, x_{i+hs/2}) as complex numbers by p * theta_i (float64), times scale."""
    angles = positions.double()[:, None] * inv_freq.double()[None, :]  # (T, hs/2)
    x = x.double()
    z = torch.complex(x[..., :HS // 2], x[..., HS // 2:]) * torch.polar(torch.ones_like(angles), angles) * scale
    return torch.cat([z.real, z.imag], dim=-1)


def theta(base=BASE):
    return torch.tensor([base ** (-2 * i / HS) for i in range(HS // 2)], dtype=torch.float64)


def close(a, b, tol=1e-4):
    return torch.allclose(a.double(), b.double(), atol=tol, rtol=tol)


# ---- Position Interpolation ------------------------------------------------------------------

def test_pi_with_factor_one_is_plain_rope_exactly():
    rope = build_encoding({"name": "rope"}, DIMS)
    q, k = qk(200)
    pos = torch.arange(200)
    plain = rope.rotate(q, k, pos, 0)
    with rope.scaled("pi", 1.0):
        scaled = rope.rotate(q, k, pos, 0)
    assert torch.equal(plain[0], scaled[0]) and torch.equal(plain[1], scaled[1])


@pytest.mark.parametrize("s", [2.0, 4.0, 3.5])
def test_pi_is_rope_at_positions_divided_by_s(s):
    rope = build_encoding({"name": "rope"}, DIMS)
    q, k = qk(100)
    pos = torch.arange(100)
    with rope.scaled("pi", s):
        qs, ks = rope.rotate(q, k, pos, 0)
    assert close(qs, reference_rotate(q, pos / s, theta()))
    assert close(ks, reference_rotate(k, pos / s, theta()))
    assert rope.scaling == ("none", None)  # restored after the block


# ---- NTK-aware and dynamic NTK ---------------------------------------------------------------

def test_ntk_base_formula_and_rotation():
    for s in (2.0, 8.0):
        assert ntk_base(BASE, s, HS) == pytest.approx(BASE * s ** (HS / (HS - 2)), rel=1e-12)
        # the lowest frequency is interpolated by exactly s, the highest (theta_0 = 1) is kept
        new = theta(ntk_base(BASE, s, HS))
        assert new[-1].item() == pytest.approx(theta()[-1].item() / s, rel=1e-9)
        assert new[0].item() == 1.0
    rope = build_encoding({"name": "rope"}, DIMS)
    q, k = qk(300)
    pos = torch.arange(300)
    with rope.scaled("ntk", 4.0):
        qs, _ = rope.rotate(q, k, pos, 0)
    expected_base = BASE * 4.0 ** (HS / (HS - 2))
    assert close(qs, reference_rotate(q, pos, theta(expected_base)), tol=3e-4)


def test_dynamic_ntk_is_plain_up_to_train_len_then_ntk_at_window_over_train_len():
    rope = build_encoding({"name": "rope"}, DIMS)
    for T in (16, TRAIN_LEN):  # windows <= train_len: exactly plain RoPE
        q, k = qk(T)
        plain = rope.rotate(q, k, torch.arange(T), 0)
        with rope.scaled("dynamic_ntk"):
            dyn = rope.rotate(q, k, torch.arange(T), 0)
        assert torch.equal(plain[0], dyn[0]) and torch.equal(plain[1], dyn[1])
    for T in (96, 256):  # longer windows: NTK with s = T / train_len, chosen per forward
        q, k = qk(T)
        with rope.scaled("dynamic_ntk", None):
            dyn = rope.rotate(q, k, torch.arange(T), 0)
        with rope.scaled("ntk", T / TRAIN_LEN):
            ntk = rope.rotate(q, k, torch.arange(T), 0)
        assert torch.equal(dyn[0], ntk[0]) and torch.equal(dyn[1], ntk[1])
        expected = reference_rotate(q, torch.arange(T), theta(BASE * (T / TRAIN_LEN) ** (HS / (HS - 2))))
        assert close(dyn[0], expected, tol=3e-4)


# ---- YaRN ------------------------------------------------------------------------------------

def reference_yarn_freqs(s, train_len, head_dim=HS, base=BASE, beta_fast=32, beta_slow=1):
    """YaRN inverse frequencies as jquesnelle/yarn and Hugging Face compute them (float64): the pair
    index where a frequency turns n times over train_len is hs ln(train_len / (2 pi n)) / (2 ln base);
    the ramp runs linearly in the index from floor(index at beta_fast) to ceil(index at beta_slow);
    pairs below it keep theta, pairs above get theta / s. -> (inv freqs, share kept per pair)."""
    def index_at(rotations):
        return head_dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(index_at(beta_fast)), 0)
    high = min(math.ceil(index_at(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    out, kept = [], []
    for i in range(head_dim // 2):
        th = 1.0 / base ** (2 * i / head_dim)
        keep = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(th / s * (1 - keep) + th * keep)
        kept.append(keep)
    return torch.tensor(out, dtype=torch.float64), kept


def test_yarn_temperature():
    for s in (1.0, 2.0, 8.0, 16.0):
        assert yarn_attention_factor(s) == pytest.approx(0.1 * math.log(s) + 1)
    # applied to q and k: a query and key at the same position (no net rotation) have logits times 1/t
    rope = build_encoding({"name": "rope"}, DIMS)
    q, k = qk(8)
    with rope.scaled("yarn", 16.0):
        qs, ks = rope.rotate(q, k, torch.arange(8), 0)
    plain = (q * k).sum(-1)
    assert close((qs * ks).sum(-1), plain * (0.1 * math.log(16.0) + 1) ** 2)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("train_len", [128, 512, 4096])
@pytest.mark.parametrize("s", [2.0, 4.0, 16.0])
def test_yarn_inverse_frequencies_match_the_reference(head_dim, train_len, s):
    expected, _ = reference_yarn_freqs(s, train_len, head_dim)
    assert torch.allclose(yarn_inv_freq(head_dim, BASE, s, train_len).double(), expected, rtol=1e-4, atol=0)
    # the rotation the encoding applies: the angle at position 1 is the inverse frequency itself,
    # and cos, sin both carry the attention factor
    rope = build_encoding({"name": "rope"}, ModelDims(2 * head_dim, 2, 1, train_len))
    cos, sin = rope.angle_table(torch.arange(2), "yarn", s)
    assert torch.allclose(torch.atan2(sin[1], cos[1]).double(), expected, rtol=1e-4, atol=0)
    assert torch.allclose(torch.hypot(sin, cos).double(), torch.full_like(cos, 0.1 * math.log(s) + 1).double(),
                          rtol=1e-5)


def test_yarn_keeps_the_highest_frequency_pair():
    """head_dim 32, train_len 128, s = 16: pair 0 turns 20 times over train_len, below beta_fast = 32,
    but the ramp starts at floor(index at 32 rotations) = 0, so the reference keeps it at 1.0x
    (a ramp linear in train_len / wavelength would give it (1 - g) / 16 + g = 0.65x, g = 0.625)."""
    got = yarn_inv_freq(32, BASE, 16.0, 128)
    assert got[0].item() == 1.0
    assert 128 / (2 * math.pi) < 32  # fewer than beta_fast rotations: inside the paper's r-ramp


def test_yarn_rotation_spans_kept_ramped_and_interpolated_pairs():
    train_len, s = 2048, 8.0
    expected, kept = reference_yarn_freqs(s, train_len)
    # this head spans all three regimes: kept (1), ramp, interpolated fully (0)
    assert kept[0] == 1.0 and kept[-1] == 0.0 and any(0 < g < 1 for g in kept)
    rope = build_encoding({"name": "rope"}, ModelDims(2 * HS, 2, 1, train_len))
    q, k = qk(50)
    pos = torch.arange(50) * 97  # positions spread up to ~4800 > train_len
    with rope.scaled("yarn", s):
        qs, _ = rope.rotate(q, k, pos, 0)
    assert close(qs, reference_rotate(q, pos, expected, scale=0.1 * math.log(s) + 1), tol=3e-3)
    keep, interp = 0, HS // 2 - 1
    assert expected[keep].item() == pytest.approx(theta()[keep].item())
    assert expected[interp].item() == pytest.approx(theta()[interp].item() / s)


# ---- xPos ------------------------------------------------------------------------------------

def test_xpos_scale_factors_match_paper():
    pos = torch.arange(0, 3000, 37)
    got = xpos_scale(pos, HS, 512.0)
    zeta = [(2 * i / HS + 0.4) / 1.4 for i in range(HS // 2)]
    expected = torch.tensor([[z ** (n / 512) for z in zeta] for n in pos.tolist()], dtype=torch.float64)
    assert torch.allclose(got.double(), expected, rtol=1e-5)
    assert build_encoding({"name": "xpos"}, DIMS).scale_base == 512.0  # the default B


def pair_dots(q, k):
    """Each rotate-half pair's share of q.k: (..., Tq, Tk, hs/2)."""
    prod = q[..., :, None, :] * k[..., None, :, :]
    return prod[..., :HS // 2] + prod[..., HS // 2:]


def test_xpos_dot_product_is_rope_times_decay_per_pair():
    B = 16.0  # small scale_base so the decay is visible over 40 positions
    xpos = build_encoding({"name": "xpos", "scale_base": B}, DIMS)
    rope = build_encoding({"name": "rope"}, DIMS)
    q, k = qk(40)
    pos = torch.arange(40)
    qx, kx = xpos.rotate(q, k, pos, 0)
    qr, kr = rope.rotate(q, k, pos, 0)
    zeta = torch.tensor([(2 * i / HS + 0.4) / 1.4 for i in range(HS // 2)], dtype=torch.float64)
    offset = (pos[:, None] - pos[None, :]).double()  # n - m
    decay = zeta[None, None, :] ** (offset[..., None] / B)  # (Tq, Tk, hs/2)
    expected = pair_dots(qr.double(), kr.double()) * decay
    assert close(pair_dots(qx.double(), kx.double()), expected, tol=1e-4)
    assert close(qx @ kx.transpose(-1, -2), expected.sum(-1), tol=1e-4)  # q.k = sum over pairs
    assert not close(qx @ kx.transpose(-1, -2), qr @ kr.transpose(-1, -2), tol=1e-2)  # the decay is there


def test_xpos_is_consistent_at_position_offsets():
    xpos = build_encoding({"name": "xpos", "scale_base": 16.0}, DIMS)
    q, k = qk(40)
    qb, kb = xpos.rotate(q, k, torch.arange(40), 0)
    base_scores = qb @ kb.transpose(-1, -2)
    for shift in (1, 100, 5000):
        qs, ks = xpos.rotate(q, k, torch.arange(40) + shift, 0)
        assert close(qs @ ks.transpose(-1, -2), base_scores, tol=1e-3)
    # slicing a longer call gives the same scores as a fresh call over the slice
    q2, k2 = qk(80, seed=1)
    qa, ka = xpos.rotate(q2, k2, torch.arange(80), 0)
    qb, kb = xpos.rotate(q2[:, :, 30:60], k2[:, :, 30:60], torch.arange(30, 60), 0)
    assert close(qa[:, :, 30:60] @ ka[:, :, 30:60].transpose(-1, -2), qb @ kb.transpose(-1, -2), tol=1e-4)


def test_xpos_under_pi_decays_at_interpolated_positions():
    xpos = build_encoding({"name": "xpos", "scale_base": 16.0}, DIMS)
    q, k = qk(40)
    pos = torch.arange(40)
    with xpos.scaled("pi", 2.0):
        qs, ks = xpos.rotate(q, k, pos, 0)
    qr, kr = reference_rotate(q, pos / 2, theta()), reference_rotate(k, pos / 2, theta())
    zeta = torch.tensor([(2 * i / HS + 0.4) / 1.4 for i in range(HS // 2)], dtype=torch.float64)
    decay = zeta ** (((pos[:, None] - pos[None, :]).double() / 2)[..., None] / 16.0)
    assert close(pair_dots(qs.double(), ks.double()), pair_dots(qr, kr) * decay, tol=1e-4)


# ---- configuration and evaluator -------------------------------------------------------------

def test_eval_config_rejects_bad_scaling_and_factor():
    with pytest.raises(PosbenchError, match="eval.rope_scaling='linear' is not valid; valid choices: "
                                            "none, pi, ntk, dynamic_ntk, yarn"):
        EvalConfig(rope_scaling="linear")
    with pytest.raises(PosbenchError, match=r"eval.rope_factor must be >= 1 .* got 0.5"):
        EvalConfig(rope_scaling="pi", rope_factor=0.5)
    with pytest.raises(PosbenchError, match="eval.rope_scaling=yarn needs a model trained with a rotary "
                                            r"encoding \(.*rope.*xpos.*\); this run uses 'alibi'"):
        check_scalable("alibi", "yarn")
    check_scalable("alibi", "none")
    check_scalable("xpos", "yarn")


def test_ladder_records_scaling_and_factor_per_length():
    tokens = np.random.default_rng(0).integers(0, 50, 1000).astype(np.int32)
    model = tiny_model("rope", train_len=16, n_heads=2)
    rows = {}
    for kind, factor in (("none", None), ("pi", None), ("yarn", None), ("ntk", 3.0), ("dynamic_ntk", 3.0)):
        ecfg = EvalConfig(lengths=[8, 16, 64], max_tokens=256, rope_scaling=kind, rope_factor=factor)
        rows[kind] = perplexity_ladder(model, tokens, [8, 16, 64], ecfg, torch.device("cpu"), None)
    assert [r["rope_factor"] for r in rows["pi"]] == [1.0, 1.0, 4.0]  # max(1, eval_len / train_len)
    assert [r["rope_factor"] for r in rows["ntk"]] == [3.0, 3.0, 3.0]  # explicit factor
    assert [r["rope_factor"] for r in rows["dynamic_ntk"]] == [1.0, 1.0, 4.0]  # always window / train_len
    assert [r["rope_factor"] for r in rows["none"]] == [1.0, 1.0, 1.0]
    assert {r["tokens"] for rs in rows.values() for r in rs} == {256}  # same tokens at every length
    for kind in ("pi", "yarn", "dynamic_ntk"):  # s = 1 up to train_len: identical to plain RoPE
        assert [r["nll"] for r in rows[kind][:2]] == [r["nll"] for r in rows["none"][:2]]
        assert rows[kind][2]["nll"] != rows["none"][2]["nll"]
    assert model.encoding.scaling == ("none", None)
    with pytest.raises(PosbenchError, match="needs a model trained with a rotary encoding"):
        perplexity_ladder(tiny_model("alibi", train_len=16, n_heads=2), tokens, [16], EvalConfig(rope_scaling="pi"),
                          torch.device("cpu"), None)


def fake_rows(scaling, lengths=(32, 64)):
    return pd.DataFrame([{"encoding": "rope", "rope_scaling": scaling, "train_len": 32, "eval_len": n,
                          "seed": 0, "split": "validation", "rope_factor": n / 32, "ppl": 10.0 + n,
                          "nll": 2.0, "tokens": 2048, "status": "ok", "model": "tiny", "data": "sotu",
                          "steps": 1, "config_hash": "x", "code_version": "0"} for n in lengths])


def test_concurrent_writers_lose_no_rows_and_old_tables_load(tmp_path):
    run = RunDir(tmp_path)
    # a results.csv from before the scaling columns: its rows read as rope_scaling 'none'
    old = fake_rows("none").drop(columns=["rope_scaling", "rope_factor"])
    old.to_csv(run.results, index=False)
    jobs = [fake_rows(kind, lengths=(32, 64, 128)) for kind in ("pi", "ntk", "dynamic_ntk", "yarn")] * 3
    threads = [threading.Thread(target=write_results, args=(run, rows)) for rows in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    df = read_results(run.results)
    assert len(df) == 2 + 4 * 3 and not df.duplicated(KEY).any()
    assert df.rope_scaling.tolist()[:2] == ["none", "none"]  # unscaled rows first
    assert set(df.rope_scaling) == {"none", "pi", "ntk", "dynamic_ntk", "yarn"}
    assert (df[df.rope_scaling == "none"].rope_factor == 1.0).all()


@pytest.mark.slow
def test_scaling_sweep_on_one_checkpoint_end_to_end(smoke_rope_run_copy, tmp_path):
    run = smoke_rope_run_copy
    proc = posbench("eval", "-m", f"checkpoint={run}", "eval.rope_scaling=none,pi,yarn", "eval.max_tokens=2048",
                    "device=cpu", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert "| rope+yarn | 32 | 512 |" in proc.stdout
    df = pd.read_csv(run / "results.csv")
    lengths = [32, 64, 128, 256, 512]
    for kind in ("none", "pi", "yarn"):
        rows = df[df.rope_scaling == kind]
        assert rows.eval_len.tolist() == lengths and (rows.status == "ok").all(), kind
        assert rows.rope_factor.tolist() == ([1.0] * 5 if kind == "none" else [n / 32 for n in lengths])
    assert len(df) == 15 and df.tokens.nunique() == 1
    at = df.set_index(["rope_scaling", "eval_len"]).ppl
    assert at["pi", 32] == at["none", 32] == at["yarn", 32]  # s = 1 at train_len
    assert at["pi", 512] != at["none", 512]
    report = posbench("report", run).stdout
    lines = [line for line in report.splitlines() if line.startswith("| rope")]
    assert [line.split("|")[1].strip() for line in lines] == ["rope", "rope+pi", "rope+yarn"]
    summary = pd.read_csv(run / "report.csv")
    assert sorted(summary.label.unique()) == ["rope", "rope+pi", "rope+yarn"] and len(summary) == 15
    # a bad scaling is one clear line
    bad = posbench("eval", f"checkpoint={run}", "eval.rope_scaling=bogus", check=False)
    assert bad.returncode == 2 and "eval.rope_scaling='bogus' is not valid; valid choices: none, pi" in bad.stderr
