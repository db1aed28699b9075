"""Each encoding's defining property against values computed here from its paper's formula."""

import math

import pytest
import torch
from conftest import tiny_model

from posbench.encodings import REGISTRY, ModelDims, PositionEncoding, PositionRangeError, build_encoding
from posbench.encodings.bias import alibi_slopes, t5_bucket
from posbench.errors import PosbenchError
from posbench.model.transformer import LanguageModel, ModelConfig

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16)


def make(name, **params):
    return build_encoding({"name": name, **params}, DIMS)


def test_sinusoidal_matches_vaswani_formula():
    enc = make("sinusoidal")
    x = torch.zeros(1, 50, DIMS.d_model)
    pe = enc.embed(x, torch.arange(50), torch.zeros(1, 50, dtype=torch.long))[0]
    for pos in (0, 1, 7, 49):
        for i in range(DIMS.d_model // 2):
            angle = pos / 10000 ** (2 * i / DIMS.d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_learned_fails_clearly_past_its_table():
    enc = make("learned")
    enc.embed(torch.zeros(1, 16, 32), torch.arange(16), torch.zeros(1, 16, dtype=torch.long))  # fine at its length
    with pytest.raises(PositionRangeError, match="16 entries.*position 63"):
        enc.embed(torch.zeros(1, 64, 32), torch.arange(64), torch.zeros(1, 64, dtype=torch.long))


def test_rope_dot_product_depends_only_on_offset():
    torch.manual_seed(0)
    q0, k0 = torch.randn(8), torch.randn(8)
    T = 40
    q = q0.expand(1, 1, T, 8).clone()
    k = k0.expand(1, 1, T, 8).clone()
    enc4 = build_encoding({"name": "rope"}, ModelDims(32, 4, 2, 16))  # head_dim 8
    qr, kr = enc4.rotate(q, k, torch.arange(T), 0)
    scores = qr[0, 0] @ kr[0, 0].T  # (T, T): q at m, k at n
    for offset in (0, 3, 17):
        diag = torch.diagonal(scores, offset=-offset)  # pairs with m - n = offset
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4)
    assert not torch.allclose(scores[5, 5], scores[5, 2])  # but it does depend on the offset
    # independent reference: complex rotation of pairs (x_i, x_{i+hs/2}) by m * 10000^(-2i/hs)
    m = 9
    zq = torch.complex(q0[:4], q0[4:]) * torch.polar(torch.ones(4), m * 10000 ** (-torch.arange(0, 8, 2) / 8))
    assert torch.allclose(qr[0, 0, m], torch.cat([zq.real, zq.imag]), atol=1e-5)


def test_alibi_slopes_from_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence
    expected12 = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected12))


def test_alibi_bias_is_minus_slope_times_distance():
    enc = make("alibi")
    bias = enc.bias(torch.arange(6), torch.arange(6), 0)  # (H, 6, 6)
    slopes = [2.0 ** (-8 / 4 * (h + 1)) for h in range(4)]
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * (i - j))


def t5_reference(n, num_buckets=32, max_distance=128):
    """T5's unidirectional bucket of a distance n = i - j, straight from the paper's code."""
    n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return n
    return min(num_buckets - 1, exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)))


def test_t5_buckets_table():
    offsets = [-5, 0, 1, 5, 15, 16, 17, 20, 23, 31, 32, 45, 64, 100, 127, 128, 129, 500, 5000]
    got = t5_bucket(torch.tensor(offsets), 32, 128).tolist()
    assert got == [t5_reference(n) for n in offsets]
    # spot values: exact below 16, log spaced above, capped at 31
    assert got[:3] == [0, 0, 1] and got[5] == 16 and got[-1] == 31 and got[7] == 17


def test_t5_bias_is_shared_table_lookup():
    enc = make("t5")
    bias = enc.bias(torch.arange(40), torch.arange(40), layer=1)
    assert bias.shape == (4, 40, 40)
    scale = math.sqrt(DIMS.d_model // DIMS.n_heads)  # x-transformers: bias * dim_head ** 0.5
    assert torch.allclose(bias[:, 39, 0], scale * enc.table.weight[t5_reference(39)])
    assert torch.equal(bias, enc.bias(torch.arange(40), torch.arange(40), layer=0))


@pytest.mark.parametrize("bias_scale, scale, std", [("sqrt_head_dim", 8.0, 1.0), ("none", 1.0, 0.02)])
def test_t5_bias_scale_and_its_init(bias_scale, scale, std):
    """sqrt_head_dim: x-transformers' sqrt(head_dim) * table with nn.Embedding's N(0, 1) table;
    none: Hugging Face T5's unscaled table, here at N(0, 0.02)."""
    torch.manual_seed(0)
    dims = ModelDims(d_model=256, n_heads=4, n_layers=2, train_len=16)  # head_dim 64, 128 table entries
    enc = build_encoding({"name": "t5", "bias_scale": bias_scale}, dims)
    assert enc.table.weight.std().item() == pytest.approx(std, rel=0.2)
    bias = enc.bias(torch.arange(20), torch.arange(20), 0)
    assert torch.allclose(bias[:, 19, 2], scale * enc.table.weight[t5_reference(17)])  # sqrt(64) = 8
    with pytest.raises(PosbenchError, match="t5 bias_scale 'sqrt' is not valid; valid choices: sqrt_head_dim, none"):
        build_encoding({"name": "t5", "bias_scale": "sqrt"}, dims)


def test_unknown_encoding_and_option_errors():
    with pytest.raises(PosbenchError, match="unknown encoding 'bogus'; valid choices: .*alibi"):
        make("bogus")
    with pytest.raises(PosbenchError, match="'t5' has no option 'buckets'; its options: num_buckets, max_distance"):
        make("t5", buckets=4)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_one_token_embedding_scale_for_every_encoding(name):
    """model.embed_scale: every encoding's embed hook receives the token embeddings times
    sqrt(d_model) (sqrt_d, the default) or times 1 (none), whatever the encoding."""
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(16)
    hidden = {}
    for scale, factor in (("sqrt_d", math.sqrt(32)), ("none", 1.0)):
        # the same weights for both settings
        model = tiny_model(name, vocab=64, train_len=16, n_layers=2, attn_chunk=8, embed_scale=scale)
        with torch.no_grad():
            x = model.encoding.embed(model.tok_emb(idx) * factor, positions, idx)  # (B, T, D)
            cache = {}
            for layer, block in enumerate(model.blocks):
                x = block(x, model.encoding, positions, layer, cache)
            hidden[scale] = model.hidden(idx)
        assert torch.allclose(hidden[scale], model.ln_f(x), atol=1e-5)
    assert ModelConfig().embed_scale == "sqrt_d"
    # the setting reaches every model; complex alone ignores the token embedding (it replaces it)
    assert torch.allclose(hidden["sqrt_d"], hidden["none"], atol=1e-5) == (name == "complex")


def test_embed_scale_validates():
    with pytest.raises(PosbenchError, match=r"^model.embed_scale='sqrt' is not valid; valid choices: sqrt_d, none$"):
        ModelConfig(embed_scale="sqrt")


# ---- the bias cache shared by layers is only used where the bias is the same in every layer ----

def per_layer_reference(model, x):
    """The model's forward pass with nothing shared between layers: each layer gets a fresh cache,
    so every bias is built from that layer's own parameters."""
    positions = torch.arange(x.shape[1])
    h = model.drop(model.encoding.embed(model.tok_emb(x) * model.emb_scale, positions, x))
    for layer, block in enumerate(model.blocks):
        h = block(h, model.encoding, positions, layer, {})
    return model.ln_f(h) @ model.tok_emb.weight.t()


def shared_cache_model(enc, chunk):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk)
    return LanguageModel(cfg, 64, enc).eval()


@pytest.mark.parametrize("chunk", [1024, 7])  # one (H, T, T) bias per forward; Toeplitz slices
@pytest.mark.parametrize("name, params", [(name, {}) for name in sorted(REGISTRY)] + [("t5", {"per_layer": True})])
def test_shared_bias_cache_equals_a_per_layer_forward(name, params, chunk):
    """A 2-layer forward with the attention's shared cache equals one that builds every layer's
    bias afresh: an encoding may only claim ``layer_invariant_bias`` when it is true."""
    dims = LanguageModel.dims(ModelConfig(d_model=32, n_layers=2, n_heads=4), 16, 64)
    model = shared_cache_model(build_encoding({"name": name, **params}, dims), chunk)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(model(x), per_layer_reference(model, x), atol=1e-5)


class _PerLayerSlopes(PositionEncoding):
    """A per-layer bias that does not mention ``layer_invariant_bias`` (not registered)."""

    relative_bias = True

    def __init__(self, dims):
        super().__init__(dims)
        self.slopes = torch.nn.Parameter(torch.tensor([[0.5] * dims.n_heads, [4.0] * dims.n_heads]))

    def bias(self, q_pos, k_pos, layer):
        return -self.slopes[layer][:, None, None] * (q_pos[:, None] - k_pos[None, :]).float()


@pytest.mark.parametrize("chunk", [1024, 7])
def test_a_per_layer_bias_that_forgets_the_flag_is_still_right(chunk):
    """The default is the safe one: without the flag, layer 1 gets its own bias, not layer 0's."""
    assert PositionEncoding.layer_invariant_bias is False
    model = shared_cache_model(_PerLayerSlopes(DIMS), chunk)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(x), per_layer_reference(model, x)
        assert torch.allclose(got, want, atol=1e-5)
        _PerLayerSlopes.layer_invariant_bias = True  # the unsafe claim reuses layer 0's bias...
        try:
            assert not torch.allclose(model(x), want, atol=1e-3)  # ...and the check above catches it
        finally:
            del _PerLayerSlopes.layer_invariant_bias


def test_a_saved_t5_run_without_bias_scale_is_rebuilt_unscaled():
    """Run dirs written before ``bias_scale`` existed trained an unscaled N(0, 0.02) table; their
    config.yaml lacks the key, and the evaluator must rebuild them so, not with the new default."""
    from omegaconf import OmegaConf

    from conftest import compose
    from posbench.model.build import build_model

    cfg = compose("encoding=t5", "model.d_model=32", "model.n_heads=4", "model.n_layers=2", "model.d_ff=64")
    assert build_model(cfg, 64).encoding.scale == pytest.approx(math.sqrt(8))  # today's default
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["encoding"]["bias_scale"], old["encoding"]["init_std"]
    enc = build_model(OmegaConf.create(old), 64).encoding
    assert enc.bias_scale == "none" and enc.scale == 1.0


# ---- every registered encoding: one source of options, bf16, 16x ------------------------------

def _yaml(name):
    from omegaconf import OmegaConf

    from posbench.config import conf_dir

    return OmegaConf.to_container(OmegaConf.load(conf_dir() / "encoding" / f"{name}.yaml"))


MAX_POSITION = "${max_position:${train.random_positions},${train.train_len}}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_yaml_declares_exactly_the_constructor_options_and_defaults(name):
    """conf/encoding/<name>.yaml names every constructor option with the constructor's default, so
    both declare the same thing; a length option reads ``${train.train_len}`` (or the table size
    ``${max_position:...}``, train_len without randomized positions) in YAML where the
    constructor's None means the same (the model's train_len)."""
    import inspect

    cfg = _yaml(name)
    assert cfg.pop("name") == name
    defaults = {p.name: p.default for p in inspect.signature(REGISTRY[name].__init__).parameters.values()
                if p.name not in ("self", "dims")}
    assert sorted(cfg) == sorted(defaults) == sorted(REGISTRY[name].params())
    for key, value in cfg.items():
        expected = None if value in ("${train.train_len}", MAX_POSITION) else value
        assert defaults[key] == expected, (key, value, defaults[key])


def test_the_readme_counts_the_built_in_encodings():
    """README's "`posbench encodings` lists the N built-in encodings" is the registry's count of
    the package's own encodings."""
    import re
    from pathlib import Path

    from posbench.encodings import REGISTRY

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    stated = int(re.search(r"`posbench encodings` lists the (\d+) built-in encodings", readme).group(1))
    assert stated == sum(cls.__module__.startswith("posbench.encodings") for cls in REGISTRY.values())
