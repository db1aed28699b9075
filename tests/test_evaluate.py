"""The perplexity ladder scores the same tokens at every length, in both protocols (non-overlapping
and sliding windows); binned loss by position, bits per byte and word perplexity; results.csv and
positions.csv merging; `posbench eval` skips rows it already has."""

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import posbench, tiny_model

from posbench.config import EvalConfig
from posbench.data.corpus import EOS, tokenize, train_tokenizer
from posbench.errors import PosbenchError
from posbench.eval.ladder import perplexity_ladder, position_bins, text_size
from posbench.eval.token_set import scored_tokens
from posbench.eval.results import COLUMNS, KEY, POSITION_COLUMNS, read_results, write_results
from posbench.runs.rundir import RunDir

CPU = torch.device("cpu")


def random_tokens(n=1000, vocab=50):
    return np.random.default_rng(0).integers(0, vocab, n).astype(np.int32)


def test_token_budget_is_a_multiple_of_every_length():
    tokens = np.arange(10_000)
    assert scored_tokens(tokens, [16, 64, 256], 5000, "validation") == 4864  # 19 * 256
    assert scored_tokens(tokens, [24, 32], 1000, "validation") == 960  # 10 * lcm 96
    with pytest.raises(PosbenchError, match="eval length 20000 is longer than the 9999 validation tokens"):
        scored_tokens(tokens, [16, 20000], 5000, "validation")
    with pytest.raises(PosbenchError, match="eval.max_tokens=100 is smaller than the longest eval length 256"):
        scored_tokens(tokens, [256], 100, "validation")
    with pytest.raises(PosbenchError, match=r"lcm 3000\) within eval.max_tokens=2000"):
        scored_tokens(tokens, [1000, 1500], 2000, "validation")


def test_sliding_token_count_leaves_whole_strides_and_bad_strides_are_refused():
    tokens = np.arange(10_000)
    sliding = EvalConfig(mode="sliding", stride=5)
    # a multiple of 12 with (n - 12) % 5 == 0: 12 * k with k = 1 (mod 5): 12 * 81 = 972 <= 1000
    assert scored_tokens(tokens, [12], 1000, "validation", sliding) == 972
    # default stride L // 2 (8 and 16): any multiple of 32 works, the same count as non-overlapping
    assert scored_tokens(tokens, [16, 32], 1000, "validation", EvalConfig(mode="sliding")) == 992
    assert EvalConfig(mode="sliding").strides([16, 32, 33]) == {16: 8, 32: 16, 33: 16}
    assert EvalConfig(mode="nonoverlapping", stride=3).strides([16, 32]) == {16: 16, 32: 32}  # ignored
    with pytest.raises(PosbenchError, match="eval.stride=64 is longer than eval length 32; valid: 1 <= eval.stride"):
        EvalConfig(mode="sliding", stride=64, lengths=[32, 128]).resolve_lengths(32)
    with pytest.raises(PosbenchError, match="eval.stride must be >= 1"):
        EvalConfig(mode="sliding", stride=0)
    with pytest.raises(PosbenchError, match="eval.stride=3 does not fit eval.lengths \\[32, 64\\]"):
        EvalConfig(mode="sliding", stride=3, lengths=[32, 64], max_tokens=2048).resolve_lengths(32)
    with pytest.raises(PosbenchError, match="eval.mode='overlap' is not valid; valid choices: nonoverlapping, sliding"):
        EvalConfig(mode="overlap")
    with pytest.raises(PosbenchError, match="eval.position_bins=\\[1, 4\\] must be increasing first positions"):
        EvalConfig(position_bins=[1, 4])


def test_ladder_matches_direct_computation():
    model, tokens = tiny_model(), random_tokens()
    ecfg = EvalConfig(lengths=[8, 32], max_tokens=200, batch_tokens=64)
    rows = perplexity_ladder(model, tokens, [8, 32], ecfg, CPU, None)
    assert [r["tokens"] for r in rows] == [192, 192]
    assert [(r["mode"], r["stride"]) for r in rows] == [("nonoverlapping", 8), ("nonoverlapping", 32)]
    ids = torch.from_numpy(tokens[:193].astype(np.int64))
    with torch.no_grad():
        nll = model(ids[:-1].view(-1, 32), targets=ids[1:].view(-1, 32)).item()  # the training loss: mean over 192
    assert rows[1]["nll"] == pytest.approx(nll, rel=1e-5)
    assert rows[1]["ppl"] == pytest.approx(math.exp(nll), rel=1e-5)


def naive_sliding(model, tokens, n, length, stride):
    """Reference: one window at a time; -> {target index: NLL} and {target index: position in window}."""
    ids = torch.from_numpy(tokens[: n + 1].astype(np.int64))
    nll, where = {}, {}
    start = 0
    while start + length <= n:
        with torch.no_grad():
            logp = F.log_softmax(model(ids[start:start + length][None])[0].float(), -1)  # (L, V)
        first = 0 if start == 0 else length - stride  # later windows score only their new tokens
        for pos in range(first, length):
            target = start + pos + 1
            assert target not in nll  # scored once
            nll[target] = -logp[pos, ids[target]].item()
            where[target] = pos
        start += stride
    return nll, where


def test_a_log_gets_a_length_s_progress_between_its_batches(monkeypatch, capsys):
    """Where stderr is not a terminal (capsys's is not), a length's windows report their progress
    at most every PROGRESS_EVERY seconds, then the length's own line; none sooner than that."""
    import posbench.eval.ladder as ladder

    model, tokens = tiny_model(), random_tokens()
    ecfg = EvalConfig(lengths=[8], max_tokens=200, batch_tokens=64)  # 25 windows, 8 a batch
    perplexity_ladder(model, tokens, [8], ecfg, CPU, None)
    assert [line.split(": ", 2)[1] for line in capsys.readouterr().err.splitlines()] == ["eval L=8"]
    monkeypatch.setattr(ladder, "PROGRESS_EVERY", 0.0)
    perplexity_ladder(model, tokens, [8], ecfg, CPU, None)
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(", ", 1)[0] for line in lines[:-1]] == [f"posbench: eval L=8: {k} of 25 windows"
                                                                for k in (8, 16, 24)]
    assert lines[-1].startswith("posbench: eval L=8: 25 windows in ")


def expected_params(d=32, layers=1, d_ff=64, vocab=50, encoding=0):
    """Parameters of a LanguageModel counted from its shape: tied token embedding V*D; per block
    qkv 3D^2 and proj D^2 (no biases), two LayerNorms 2*2D, MLP D*d_ff + d_ff + d_ff*D + D; final
    LayerNorm 2D; plus the encoding's own."""
    block = 4 * d * d + 4 * d + 2 * d * d_ff + d_ff + d
    return vocab * d + layers * block + 2 * d + encoding


@pytest.mark.parametrize("name, pos_params", [("alibi", 0), ("learned", 8 * 32), ("t5", 32 * 4),
                                              ("complex", 3 * 50 * 16)])
def test_ladder_rows_carry_parameter_counts(name, pos_params):
    """learned: a (train_len, D) table; t5: 32 buckets x 4 heads; complex: r, omega, theta of
    (V, D/2) each, an input table beside the tied token embedding."""
    rows = perplexity_ladder(tiny_model(name), random_tokens(), [8], EvalConfig(lengths=[8], max_tokens=64), CPU, None)
    assert (rows[0]["params"], rows[0]["pos_params"]) == (expected_params(encoding=pos_params), pos_params)


@pytest.mark.parametrize("lengths, stride", [([8, 16], None), ([12], 5), ([8, 16], 1)])
def test_sliding_window_matches_a_window_by_window_loop(lengths, stride):
    model, tokens = tiny_model(), random_tokens()
    ecfg = EvalConfig(lengths=lengths, max_tokens=200, batch_tokens=40, mode="sliding", stride=stride,
                      position_bins=[0, 2, 7])
    rows = perplexity_ladder(model, tokens, lengths, ecfg, CPU, None)
    n = rows[0]["tokens"]
    for row, length in zip(rows, lengths):
        s = stride or length // 2
        assert (row["mode"], row["stride"], row["tokens"]) == ("sliding", s, n)
        nll, where = naive_sliding(model, tokens, n, length, s)
        assert sorted(nll) == list(range(1, n + 1))  # the same tokens 1..n at every length
        assert row["nll"] == pytest.approx(sum(nll.values()) / n, rel=1e-5)
        assert row["token_nll"].dtype == np.float32  # each target's loss, in target order
        assert row["token_nll"] == pytest.approx([nll[t] for t in range(1, n + 1)], rel=1e-4, abs=1e-5)
        for b in row["positions"]:  # the same bins from the reference's per-token losses
            inside = [v for t, v in nll.items() if b["bin_start"] <= where[t] <= b["bin_end"]]
            assert b["tokens"] == len(inside) and b["nll"] == pytest.approx(np.mean(inside), rel=1e-5)


def test_sliding_with_stride_equal_to_length_is_nonoverlapping():
    model, tokens = tiny_model(), random_tokens()
    plain = perplexity_ladder(model, tokens, [16], EvalConfig(lengths=[16], max_tokens=320), CPU, None)
    slide = perplexity_ladder(model, tokens, [16], EvalConfig(lengths=[16], max_tokens=320, mode="sliding",
                                                              stride=16), CPU, None)
    assert slide[0]["nll"] == plain[0]["nll"] and slide[0]["positions"] == plain[0]["positions"]
    assert (slide[0]["mode"], slide[0]["stride"]) == ("sliding", 16)


def test_position_bins_and_their_weighted_mean_is_the_row_nll():
    assert position_bins(10) == [(0, 0), (1, 1), (2, 3), (4, 7), (8, 9)]
    assert position_bins(8) == [(0, 0), (1, 1), (2, 3), (4, 7)]
    assert position_bins(1) == [(0, 0)]
    assert position_bins(8, [0, 3, 100]) == [(0, 2), (3, 7)]
    model, tokens = tiny_model(), random_tokens()
    for mode, stride in (("nonoverlapping", None), ("sliding", 2)):
        ecfg = EvalConfig(lengths=[8, 32], max_tokens=256, mode=mode, stride=stride)
        for row in perplexity_ladder(model, tokens, [8, 32], ecfg, CPU, None):
            bins = pd.DataFrame(row["positions"])
            assert bins.bin_start.tolist() == [a for a, _ in position_bins(row["eval_len"])]
            assert bins.tokens.sum() == row["tokens"]
            assert (bins.nll * bins.tokens).sum() / bins.tokens.sum() == pytest.approx(row["nll"], rel=1e-12)


DOCS = ["The grass is green. Déjà vu — “quoted” text, 3 × 4 = 12.\n\nNew paragraph here.",
        "Second document: naïve café, ünïcode 日本語 and emoji 🙂 end.", "Third one, short."]


def test_text_size_counts_the_bytes_and_words_the_tokens_spell():
    tok = train_tokenizer(DOCS, 300, 1)
    ids = tokenize(tok, DOCS, "eos")
    nbytes, words = text_size(tok, ids)
    assert nbytes == sum(len(d.encode("utf-8")) for d in DOCS)  # exact, multi-byte characters included
    assert words == sum(len(d.split()) for d in DOCS)  # the separator ends a word
    assert [tok.decode(tok.encode(d).ids) for d in DOCS] == DOCS  # the decoder round-trips the text
    # cut anywhere, even inside a multi-byte character, the two parts' bytes add up exactly
    doc = tok.encode(DOCS[1]).ids
    cuts = [k for k in range(1, len(doc)) if "\ufffd" in tok.decode(doc[:k])]
    assert cuts  # some cut does split a character (decoding would count U+FFFD's 3 bytes there)
    for k in range(1, len(doc)):
        assert text_size(tok, doc[:k])[0] + text_size(tok, doc[k:])[0] == len(DOCS[1].encode())


ASCII = ["The grass is green. The sky is blue.\n\nNew paragraph here.",
         "Second document: plain words, numbers 3 x 4 = 12 and   spaces.", "Third one, short."]


def test_ladder_reports_bits_per_byte_and_word_perplexity():
    tok = train_tokenizer(ASCII * 4, 300, 1)
    tokens = tokenize(tok, ASCII * 20, "eos")  # ASCII: the decoder is exact on any slice
    model = tiny_model(vocab=tok.get_vocab_size())
    rows = perplexity_ladder(model, tokens, [8, 16], EvalConfig(lengths=[8, 16], max_tokens=320), CPU, None,
                             tokenizer=tok)
    n = rows[0]["tokens"]
    scored = tokens[1:n + 1].tolist()
    eos = tok.token_to_id(EOS)
    docs, current = [], []  # the scored text, document by document, through the tokenizer's own decoder
    for i in scored + [eos]:
        if i == eos:
            docs.append(tok.decode(current))
            current = []
        else:
            current.append(i)
    nbytes, words = sum(len(d.encode()) for d in docs), sum(len(d.split()) for d in docs)
    for row in rows:
        assert (row["bytes"], row["words"]) == (nbytes, words)
        assert row["bpb"] == pytest.approx(row["nll"] * n / (math.log(2) * nbytes), rel=1e-12)
        assert row["word_ppl"] == pytest.approx(math.exp(row["nll"] * n / words), rel=1e-12)


def results_row(eval_len, mode="nonoverlapping", stride=None, ppl=10.0):
    return {"encoding": "alibi", "rope_scaling": "none", "train_len": 32, "eval_len": eval_len, "seed": 0,
            "split": "validation", "mode": mode, "stride": stride or eval_len, "rope_factor": 1.0, "ppl": ppl,
            "nll": math.log(ppl), "bpb": 1.0, "word_ppl": 20.0, "tokens": 2048, "bytes": 9000, "words": 1500,
            "status": "ok", "model": "tiny", "data": "sotu", "steps": 30, "config_hash": "h", "code_version": "0"}


def test_old_results_merge_and_positions_are_replaced_by_key(tmp_path):
    run = RunDir(tmp_path)
    old = pd.DataFrame([results_row(n) for n in (32, 64)]).drop(columns=["mode", "stride", "bpb", "word_ppl",
                                                                          "bytes", "words"])
    old.to_csv(run.results, index=False)  # a results.csv from before the evaluation protocols
    bins = lambda n, nll: [{**results_row(n, "sliding", 16), "bin_start": a, "bin_end": b, "nll": nll, "tokens": 1}
                           for a, b in position_bins(n)]
    write_results(run, pd.DataFrame([results_row(64, ppl=20.0), results_row(64, "sliding", 16, ppl=9.0)]),
                  positions=bins(64, 1.0))
    df = pd.read_csv(run.results)
    assert df.columns.tolist() == COLUMNS
    assert df[KEY[3:]].values.tolist() == [[32, 0, "validation", "nonoverlapping", 32],
                                           [64, 0, "validation", "nonoverlapping", 64],
                                           [64, 0, "validation", "sliding", 16]]
    assert df.ppl.tolist() == [10.0, 20.0, 9.0]  # the same key replaced, a new key added
    assert math.isnan(df.bpb[0]) and df.bpb[1] == 1.0
    positions = pd.read_csv(tmp_path / "positions.csv")
    assert positions.columns.tolist() == POSITION_COLUMNS and len(positions) == 7
    # fewer, other bins for the same key: every old bin of that key goes
    write_results(run, pd.DataFrame([results_row(64, "sliding", 16)]),
                  positions=[{**results_row(64, "sliding", 16), "bin_start": 0, "bin_end": 63, "nll": 2.0,
                              "tokens": 2048}])
    positions = pd.read_csv(tmp_path / "positions.csv")
    assert positions[["bin_start", "bin_end", "nll"]].values.tolist() == [[0, 63, 2.0]]


@pytest.mark.parametrize("digest", ["000000001234", "28586650e810", "1e5"])
def test_a_hash_that_reads_as_a_number_stays_the_text_it_was_written_as(tmp_path, digest):
    """A config hash of digits, or digits around one "e", is read back and merged as written: read
    as a number it would name no run, a study would plan its run again, and an evaluation would
    compute its rows again (and write the hash back as a float)."""
    from posbench.study.planning import _finished_keys

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    row = lambda n: {**results_row(n), "config_hash": digest, "code_version": "1234567"}
    write_results(run, pd.DataFrame([row(32)]))
    write_results(run, pd.DataFrame([row(64)]))  # merged into the rows it reads back
    assert run.results.read_text().count(f",{digest},1234567,") == 2
    df = read_results(run.results)
    assert df.config_hash.tolist() == [digest] * 2 and df.code_version.tolist() == ["1234567"] * 2
    assert _finished_keys(tmp_path, finished_only=False) == {(digest, 0)}


# ---------------------------------------------------------------- end to end on the smoke run
@pytest.mark.slow
def test_training_run_writes_new_columns_positions_and_text_metrics(smoke_run):
    from omegaconf import OmegaConf

    from posbench.data.corpus import load_corpus, load_documents

    df = pd.read_csv(smoke_run / "results.csv")
    assert df.columns.tolist() == COLUMNS
    assert (df["mode"] == "nonoverlapping").all() and (df.stride == df.eval_len).all()
    assert (df.params > 0).all() and (df.pos_params == 0).all()  # alibi: no position parameters
    positions = pd.read_csv(smoke_run / "positions.csv")
    assert positions.columns.tolist() == POSITION_COLUMNS
    for row in df.itertuples():
        bins = positions[positions.eval_len == row.eval_len]
        assert bins.bin_start.tolist() == [0] + [2 ** k for k in range(int(math.log2(row.eval_len)))]
        assert (bins.nll * bins.tokens).sum() / bins.tokens.sum() == pytest.approx(row.nll, rel=1e-9)
    assert df.bytes.nunique() == df.words.nunique() == 1
    assert np.allclose(df.bpb, df.nll * df.tokens / (math.log(2) * df.bytes))
    assert np.allclose(df.word_ppl, np.exp(df.nll * df.tokens / df.words))
    # the whole validation split through text_size gives the bytes and words of its documents
    data = OmegaConf.load(smoke_run / "config.yaml").data
    corpus = load_corpus(data)
    texts = load_documents(data)["validation"]["text"]
    assert text_size(corpus.tokenizer, corpus.splits["validation"]) == (
        corpus.meta["splits"]["validation"]["bytes"], sum(len(t.split()) for t in texts))


@pytest.mark.slow
def test_rows_say_how_the_run_trained_and_a_later_eval_keeps_it(smoke_run_copy):
    """results.csv's ``execution`` (outside the config hash): device, precision, eager, compiled or
    CUDA graphs, as versions.json recorded it at training; a later eval's rows say the same."""
    run = smoke_run_copy
    trained = RunDir(run).execution()
    assert re.fullmatch(r"cpu (bf16|fp32) eager", trained), trained
    assert set(pd.read_csv(run / "results.csv").execution) == {trained}
    posbench("eval", f"checkpoint={run}", "device=cpu", "eval.lengths=[16]")
    df = read_results(run / "results.csv")
    assert 16 in set(df.eval_len) and set(df.execution) == {trained}
    old = df.drop(columns="execution")  # a run's rows from before the record: unknown, not an error
    old.to_csv(run / "results.csv", index=False)
    assert read_results(run / "results.csv").execution.isna().all()


def test_eval_skips_rows_it_has_and_adds_sliding_rows(smoke_run_copy):
    run = smoke_run_copy

    def posbench_eval(*args):
        return posbench("eval", f"checkpoint={run}", "device=cpu", "eval.max_tokens=2048", *args)

    before = (run / "results.csv").read_bytes()
    proc = posbench_eval()  # the training run's settings again
    assert "posbench: all lengths already in" in proc.stderr and "not recomputed" in proc.stderr
    assert "| alibi | 32 | 512 |" in proc.stdout
    assert (run / "results.csv").read_bytes() == before  # nothing rewritten
    proc = posbench_eval("eval.lengths=[16,32]")
    assert "posbench: eval_len 32 already in" in proc.stderr
    df = pd.read_csv(run / "results.csv")
    assert df.eval_len.tolist() == [16, 32, 64, 128, 256, 512] and df.tokens.nunique() == 1
    proc = posbench_eval("eval.lengths=[32,64]", "eval.mode=sliding")
    assert "already in" not in proc.stderr
    df = pd.read_csv(run / "results.csv").set_index(["mode", "eval_len"])
    assert df.loc[("sliding", 32), "stride"] == 16 and df.loc[("sliding", 64), "stride"] == 32
    assert df.loc[("sliding", 32), "tokens"] == df.loc[("nonoverlapping", 32), "tokens"] == 2048
    assert df.loc[("sliding", 32), "bytes"] == df.loc[("nonoverlapping", 32), "bytes"]
    positions = pd.read_csv(run / "positions.csv").set_index(["mode", "eval_len"]).sort_index()
    sliding32 = positions.loc[("sliding", 32)]
    early, late = sliding32[sliding32.bin_start < 16], sliding32[sliding32.bin_start == 16]
    assert late.tokens.item() == 16 * ((2048 - 32) // 16 + 1)  # 16..31 are new in each of the 127 windows
    assert (early.tokens == early.bin_end - early.bin_start + 1).all()  # 0..15: the first window only
    assert "already in" not in posbench_eval("eval.lengths=[32]", "eval.recompute=true").stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["eval.mode=overlap"], "eval.mode='overlap' is not valid; valid choices: nonoverlapping, sliding"),
    (["eval.mode=sliding", "eval.stride=64", "eval.lengths=[32,64]"], "eval.stride=64 is longer than eval length 32"),
    (["eval.mode=sliding", "eval.stride=0"], "eval.stride must be >= 1"),
    (["eval.position_bins=[2,4]"], "eval.position_bins=[2, 4] must be increasing first positions starting at 0"),
])
def test_bad_eval_protocol_values_are_one_line_errors(smoke_run, args, message):
    proc = posbench("eval", f"checkpoint={smoke_run}", "device=cpu", "eval.max_tokens=2048", *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"posbench: error: {message}" or \
        proc.stderr.strip().splitlines()[-1].startswith(f"posbench: error: {message}")


def test_a_trained_run_is_one_subject_whose_weights_load_only_for_a_length_to_compute(smoke_run_copy):
    """posbench eval opens a run as a Subject (posbench.eval.subject), as it opens a pretrained
    model, and runs the one ladder on it: where results.csv holds every length nothing is loaded,
    and the rows it returns are those of this evaluation, kept or computed."""
    from omegaconf import OmegaConf

    from posbench.config import conf_dir
    from posbench.eval.ladder import evaluate_subject
    from posbench.eval.subject import TrainedRun, open_subject

    ecfg = OmegaConf.load(conf_dir() / "eval" / "default.yaml")
    ecfg.max_tokens = 2048

    def opened(**changes):
        return open_subject(OmegaConf.create({"checkpoint": str(smoke_run_copy), "device": "cpu",
                                              "eval": OmegaConf.merge(ecfg, changes)}))

    subject = opened()
    assert isinstance(subject, TrainedRun) and subject.model is None and subject.out == smoke_run_copy
    kept = evaluate_subject(subject)
    assert subject.model is None and kept.eval_len.tolist() == [32, 64, 128, 256, 512]
    subject = opened(lengths=[16, 32])
    rows = evaluate_subject(subject)
    assert subject.model is not None and rows.eval_len.tolist() == [16, 32] and (rows.status == "ok").all()
    assert rows.ppl.iloc[1] == kept.ppl.iloc[0]  # 32 kept, as stored
