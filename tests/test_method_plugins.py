"""An inference-time method from outside the package: one class, found by its import path (or an
entry point), computed by the same attention code as the built-ins, and evaluated beside them."""

import math
import os
import textwrap

import pytest
import torch

from posbench.encodings.extension import extended_attention
from posbench.encodings.rotation import rotate  # posbench's pairing of dims: what the method rotates with
from posbench.errors import PosbenchError
from posbench.methods import Extension, methods

PLUGIN = textwrap.dedent('''
    """A method outside posbench: each query sees only its last W keys, at their trained positions."""
    import torch

    from posbench.errors import PosbenchError
    from posbench.methods import Extension, RopeScaling
    from posbench.methods.base import near_part


    class LocalWindow(Extension, name="local_window"):
        params = ("W", None)
        kernel = "parts"

        def validate(self):
            if not (self.window and self.window > 0):
                raise PosbenchError(f"eval.extension=local_window needs eval.extension_window > 0, got {self.window}")

        def identity_at(self, length):
            return length <= self.window

        def visible(self, i, j):
            return (j <= i) & (i - j < self.window)

        def parts(self, T, device=None):
            return [near_part(torch.arange(T, device=device), self.window)]


    class NotAMethod:
        pass


    class SqrtPI(RopeScaling, name="sqrt_pi"):
        """A RoPE scaling outside posbench: positions over sqrt(s), s = T / L per window."""

        def factor(self, requested, window_len, original_len):
            return max(1.0, window_len / original_len) if requested is None else float(requested)

        def position_divisor(self, s):
            return s ** 0.5


    class NanScaling(SqrtPI, name="nan_scaling"):
        """Frequencies of NaN past the trained context."""

        def inv_freq(self, rotation, s, device=None):
            return rotation.trained(device) * float("nan")


    class ClaimsIdentity(LocalWindow, name="claims_identity"):
        """Says it leaves every length as trained, which a window of W does not past W."""

        def identity_at(self, length):
            return True


    class SeesTheFuture(LocalWindow, name="sees_the_future"):
        """Its mask lets a query see keys after it."""

        def visible(self, i, j):
            return i - j < self.window

        def parts(self, T, device=None):
            from posbench.methods.base import Part
            pos = torch.arange(T, device=device)
            return [Part(pos, pos, lambda i, j: (i - j < self.window) & (j - i < 4), lambda s, e: (0, T))]
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    from posbench.methods.base import REGISTRY
    from posbench.methods.rope import SCALING_REGISTRY

    for name in ("local_window", "claims_identity", "sees_the_future"):  # later tests see the built-ins alone
        REGISTRY.pop(name, None)
    SCALING_REGISTRY.pop("sqrt_pi", None)
    SCALING_REGISTRY.pop("nan_scaling", None)


@pytest.mark.parametrize("fused", [True, False])
def test_a_method_by_import_path_computes_its_definition(plugin, fused):
    """The plugin's attention, through extended_attention's fused and chunked paths, equals softmax
    over the last W keys of RoPE-rotated q and k written out here."""
    ext = Extension("my_methods:LocalWindow", window=5, train_len=16)
    assert type(ext).__name__ == "LocalWindow" and ext.method == "local_window" and ext.label == "local_window(W=5)"
    assert "local_window" in methods()
    torch.manual_seed(0)
    T, hs = 23, 8
    q, k, v = (torch.randn(1, 2, T, hs) for _ in range(3))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, hs, 2).float() / hs)
    got = extended_attention(q, k, v, inv_freq, ext, 1 / math.sqrt(hs), chunk=4, fused=fused, block=7)
    angles = torch.arange(T)[:, None] * inv_freq
    logits = rotate(q, angles) @ rotate(k, angles).transpose(-1, -2) / math.sqrt(hs)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    want = logits.masked_fill(~((j <= i) & (i - j < 5)), float("-inf")).softmax(-1) @ v
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_a_path_that_is_not_a_method_is_one_line(plugin):
    with pytest.raises(PosbenchError, match=r"eval.extension=my_methods:NotAMethod is not a subclass of "
                                            r"posbench.methods.Extension"):
        Extension("my_methods:NotAMethod")
    with pytest.raises(PosbenchError, match=r"eval.extension=no_such_module:X needs module 'no_such_module'"):
        Extension("no_such_module:X")


def test_a_rope_scaling_by_import_path_scales_trained_and_pretrained_rotations_alike(plugin):
    """A scaling from outside: found by its import path and then by its name, listed beside the
    built-ins, and the one class sets both a posbench rotary run's angles (positions over sqrt(s))
    and the frequencies a pretrained model's rotary module is handed (theta / sqrt(s))."""
    from posbench.encodings import ModelDims, build_encoding
    from posbench.methods import Rotation, rope_inv_freq, scaling, scalings

    method = scaling("my_methods:SqrtPI")
    assert type(method).__name__ == "SqrtPI" and method.name == "sqrt_pi" and scaling("sqrt_pi").name == "sqrt_pi"
    assert list(scalings()) == ["none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3", "sqrt_pi"]
    rope = build_encoding({"name": "rope"}, ModelDims(d_model=32, n_heads=2, n_layers=1, train_len=16))
    pos = torch.arange(40)
    cos, sin = rope.angle_table(pos, "sqrt_pi", 4.0)
    angles = (pos.float() / 2.0)[:, None] * rope_inv_freq(16, 10000.0)[None, :]
    torch.testing.assert_close((cos, sin), (angles.cos(), angles.sin()))
    torch.testing.assert_close(method.frequencies(Rotation(10000.0, 16, 16), 4.0), rope_inv_freq(16, 10000.0) / 2.0)
    with pytest.raises(PosbenchError, match=r"^eval.rope_scaling=my_methods:NotAMethod is not a subclass of "
                                            r"posbench.methods.RopeScaling"):
        scaling("my_methods:NotAMethod")
    with pytest.raises(PosbenchError, match=r"^eval.rope_scaling='bogus' is not valid; valid choices: none, pi, ntk, "
                                            r"dynamic_ntk, yarn, llama3, sqrt_pi$"):
        scaling("bogus")


@pytest.mark.slow
def test_posbench_eval_runs_a_plugin_method_beside_a_built_in(plugin, tmp_path):
    """`posbench eval pretrained=... eval.extension=my_methods:LocalWindow` on a tiny random Llama:
    its rows beside rerope's, named by the plugin's label, the model as trained within its window."""
    import pandas as pd

    from posbench.data.corpus import sotu_files, train_tokenizer
    from tests.conftest import posbench

    transformers = pytest.importorskip("transformers")
    path = tmp_path / "llama"
    tok = train_tokenizer([p.read_text() for p in sotu_files()[:2]], 2000, 2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32)).save_pretrained(path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(path)
    out, common = tmp_path / "out", (f"pretrained={path}", "eval.lengths=[16,64]", "eval.max_tokens=256")
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    posbench("eval", *common, f"out={out}", "eval.extension=rerope", "eval.extension_window=8", env=env)
    posbench("eval", *common, f"out={out}", "eval.extension=my_methods:LocalWindow", "eval.extension_window=16",
             env=env)
    # or method=NAME from a config dir holding method/NAME.yaml (its import path and options): the same rows
    (plugin / "conf" / "method").mkdir(parents=True)
    (plugin / "conf" / "method" / "local_window.yaml").write_text("name: my_methods:LocalWindow\nwindow: 16\n")
    before = pd.read_csv(out / "results.csv")
    posbench("eval", "--config-dir", str(plugin / "conf"), *common, f"out={out}", "method=local_window", env=env)
    assert pd.read_csv(out / "results.csv").equals(before)
    posbench("eval", *common, f"out={out}", "eval.rope_scaling=my_methods:SqrtPI", env=env)
    posbench("eval", *common, f"out={out}", "eval.rope_scaling=pi", env=env)
    rows = pd.read_csv(out / "results.csv")
    assert sorted(set(rows.rope_scaling)) == ["local_window(W=16)", "none", "pi", "rerope(W=8)", "sqrt_pi"]
    assert (rows.status == "ok").all()
    at = rows.set_index(["rope_scaling", "eval_len"]).ppl
    assert at["local_window(W=16)", 64] != at["none", 16]  # a window of 16 at 64 tokens is not the model as trained
    factor = rows.set_index(["rope_scaling", "eval_len"]).rope_factor
    assert factor["sqrt_pi", 64] == factor["pi", 64] == 2.0 and at["sqrt_pi", 64] not in (at["pi", 64], at["none", 16])
    # and reported beside the built-ins: a table row and a sentence each, the plugin's as the built-ins'
    posbench("report", str(out), "--out", str(tmp_path / "report"), "--no-reference", env=env)
    md = (tmp_path / "report" / "report.md").read_text()
    for line in ("rope+local_window(W=16)", "rope+rerope(W=8)", "rope+sqrt_pi", "rope+pi"):
        assert f"| {line} | 32 | 1 |" in md and f"\n- {line}: " in md, line


def test_method_checks_pass_the_built_ins_and_the_plugin_and_fail_a_broken_one(plugin):
    """posbench check eval.extension=...: every built-in passes; a method that claims to leave the
    model as trained where it does not fails identity; one whose mask sees later keys fails causality."""
    from posbench.model.conformance import ConformanceError, check_method
    from tests.conftest import posbench

    for name, window, group in [("self_extend", 8, 2), ("rerope", 8, None), ("logn", None, None),
                                ("llama3", None, None), ("string", None, None), ("sinks", None, None),
                                ("lm_infinite", None, None), ("dca", None, None)]:
        assert check_method(name, window, group, ["identity", "causality", "bf16"])
    assert check_method("my_methods:LocalWindow", 8, None) == ["identity", "causality", "bf16", "pretrained"]
    with pytest.raises(ConformanceError, match=r"claims_identity\(W=8\): identity: says it leaves the model as trained "
                                               r"at 16 tokens \(identity_at\), but its logits differ"):
        check_method("my_methods:ClaimsIdentity", 8, None, ["identity"])
    with pytest.raises(ConformanceError, match=r"causality: changing tokens 25.. changed the logits of tokens < 25"):
        check_method("my_methods:SeesTheFuture", 8, None, ["causality"])
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = posbench("check", "eval.extension=my_methods:LocalWindow", "eval.extension_window=8", env=env).stdout
    assert out.splitlines()[-1] == "method=my_methods:LocalWindow: 4 of 4 checks passed"
    bad = posbench("check", "eval.extension=my_methods:ClaimsIdentity", "eval.extension_window=8", "--only",
                   "identity", env=env, check=False)
    assert bad.returncode == 1 and bad.stdout.splitlines()[0].startswith("FAIL  identity: ")
    # a RoPE scaling is held to the same checks: every built-in and the outside one pass, a broken one fails
    from posbench.model.conformance import ScalingUnderCheck

    for kind in ("pi", "ntk", "dynamic_ntk", "yarn", "llama3"):
        assert check_method(ScalingUnderCheck(kind), checks=["identity", "causality", "bf16"])
    out = posbench("check", "eval.rope_scaling=my_methods:SqrtPI", env=env).stdout
    assert out.splitlines()[-1] == "eval.rope_scaling=sqrt_pi: 4 of 4 checks passed"
    bad = posbench("check", "eval.rope_scaling=my_methods:NanScaling", "--only", "bf16", env=env, check=False)
    assert bad.returncode == 1 and bad.stdout.splitlines()[0] == (
        "FAIL  bf16: eval.rope_scaling=nan_scaling: bf16: logits under bf16 autocast are not finite")
