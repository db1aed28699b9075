"""The passkey-retrieval probe: prompts of exact length with the key at the asked depth, a copying
model finds every key and a random one none, and `posbench eval probe=passkey` end to end."""

import math

import pandas as pd
import pytest
import torch
from conftest import posbench, tiny_model
from torch import nn

from posbench.data.corpus import train_tokenizer
from posbench.errors import PosbenchError
from posbench.eval.passkey import COLUMNS, FILLER, KEY_SENTENCE, QUESTION, PasskeyConfig, passkey_probe, passkey_prompt

CPU = torch.device("cpu")
TEXT = [" ".join(FILLER) * 3, KEY_SENTENCE.format(key=12345), QUESTION, "Numbers 0 1 2 3 4 5 6 7 8 9 and 2024."]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXT, 300, 1)


def encode(tok, text):
    return tok.encode(" " + text).ids


@pytest.mark.parametrize("filler", [0, 5, 40, 250])
def test_prompt_has_the_requested_length_and_the_key_at_the_requested_depth(tok, filler):
    key = 71432
    sentence, answer = encode(tok, KEY_SENTENCE.format(key=key)), encode(tok, "71432")
    length = len(sentence) + len(encode(tok, QUESTION)) + filler + len(answer) - 1
    longest = max(len(encode(tok, s)) for s in FILLER)
    starts = []
    for depth in (0, 0.25, 0.5, 0.75, 1.0):
        p = passkey_prompt(tok, length, depth, key)
        # the forward pass, prompt + key tokens but the last, is exactly the asked length
        assert len(p.forward_ids) == length and p.forward_ids == p.ids + answer[:-1]
        assert len(p.ids) == length - (len(answer) - 1)
        assert p.filler == filler
        assert p.ids[p.key_start:p.key_start + len(sentence)] == sentence  # the key sentence, whole
        assert abs(p.key_start - depth * p.filler) <= longest  # within a filler sentence of the depth
        text = tok.decode(p.ids)
        assert text.count("71432") == 2 and text.endswith(" " + QUESTION)
        before = tok.decode(p.ids[:p.key_start])
        assert before == "" or before.endswith(".")  # the key goes between filler sentences
        assert p.answer == encode(tok, "71432")
        starts.append(p.key_start)
    assert starts == sorted(starts) and starts[0] == 0


class Copier(nn.Module):
    """Predicts, at each position, the token that followed the earlier position whose preceding
    tokens match the longest suffix of the context (an induction head, by hand)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.vocab)
        for b in range(B):
            x = idx[b]
            match = torch.zeros(T, T, dtype=torch.long)  # match[t, j]: common suffix of x[:t+1] and x[:j+1]
            for t in range(T):
                same = (x[:t] == x[t]).long()
                match[t, :t] = same * (1 + (torch.cat([torch.zeros(1, dtype=torch.long), match[t - 1, :t - 1]])
                                            if t else 0))
                if t and match[t, :t].max() > 0:
                    j = t - 1 - int(torch.argmax(match[t, :t].flip(0)))  # the latest longest match
                    logits[b, t, x[j + 1]] = 10.0
        return logits


def test_a_copying_model_finds_every_key_and_a_random_one_none(tok):
    pcfg = PasskeyConfig(trials=4, depths=[0.0, 0.5, 1.0])
    copier = passkey_probe(Copier(tok.get_vocab_size()), tok, pcfg, [60, 120], CPU, None)
    assert [(r["length"], r["depth"]) for r in copier] == [(n, d) for n in (60, 120) for d in (0.0, 0.5, 1.0)]
    assert all(r["accuracy"] == 1.0 and r["correct"] == 4 and r["status"] == "ok" for r in copier)
    # its log-prob: 10 on the key token against 0 elsewhere
    expected = 10 - math.log(math.exp(10) + tok.get_vocab_size() - 1)
    assert all(r["logprob"] == pytest.approx(expected, rel=1e-4) for r in copier)  # float32 softmax
    rand = passkey_probe(tiny_model(vocab=tok.get_vocab_size(), train_len=32), tok, pcfg, [60, 120], CPU, None)
    assert all(r["accuracy"] == 0.0 and r["correct"] == 0 for r in rand)
    assert all(abs(r["logprob"] + math.log(tok.get_vocab_size())) < 0.5 for r in rand)  # about uniform


class WholeForward(nn.Module):
    """The model called whole, as a causal LM without ``hidden`` and ``logits`` is."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        return self.model(idx)


def test_the_key_is_scored_from_logits_at_its_positions_alone(tok, monkeypatch):
    """A LanguageModel's key is scored from the head's logits at the key's positions only (a 262k
    vocabulary over a 32k prompt would be 34 GB of logits), and scores as the whole forward does."""
    from posbench.eval.passkey import score_prompts

    torch.manual_seed(0)
    model = tiny_model("rope", vocab=tok.get_vocab_size(), train_len=64).eval()
    prompts = [passkey_prompt(tok, 96, depth, key) for depth in (0.0, 1.0) for key in (12345, 71432)]
    rows = []
    head = model.logits
    monkeypatch.setattr(model, "logits", lambda hidden: rows.append(hidden.shape[1]) or head(hidden))
    correct, logprob = score_prompts(model, prompts, CPU, None, 4096)
    assert sorted(set(rows)) == sorted({len(p.answer) for p in prompts})  # the key's tokens, not the prompt's 96
    monkeypatch.undo()
    whole_correct, whole_logprob = score_prompts(WholeForward(model), prompts, CPU, None, 4096)
    assert (correct == whole_correct).all()
    torch.testing.assert_close(torch.tensor(logprob), torch.tensor(whole_logprob), rtol=0, atol=1e-5)
    assert (logprob < 0).all() and not torch.tensor(logprob).isnan().any()


def test_lengths_a_model_cannot_represent_get_nan_rows(tok):
    model = tiny_model("learned", {"max_len": 80}, vocab=tok.get_vocab_size(), train_len=64)
    rows = passkey_probe(model, tok, PasskeyConfig(trials=2, depths=[0.5]), [64, 128], CPU, None)
    assert rows[0]["status"] == "ok" and 0 <= rows[0]["accuracy"] <= 1
    assert rows[1]["status"].startswith("n/a: learned position table has 80 entries")
    assert math.isnan(rows[1]["accuracy"]) and math.isnan(rows[1]["logprob"]) and rows[1]["correct"] is None


def test_a_row_at_length_l_uses_exactly_l_positions(tok):
    """A learned table of train_len entries is probed at L = train_len (not n/a), and one entry
    short of L it cannot be: the forward pass is exactly L positions, for keys of any token count."""
    pcfg = PasskeyConfig(trials=6, depths=[0.0, 1.0])
    assert len({len(encode(tok, str(key))) for key in pcfg.keys()}) > 1  # keys of different token counts
    train_len = 64
    for max_len, status in ((train_len, "ok"), (train_len - 1, "n/a: learned position table has 63 entries")):
        model = tiny_model("learned", {"max_len": max_len}, vocab=tok.get_vocab_size(), train_len=train_len)
        rows = passkey_probe(model, tok, pcfg, [train_len], CPU, None)
        assert all(r["status"].startswith(status) for r in rows)
        if status == "ok":
            assert all(0 <= r["accuracy"] <= 1 and not math.isnan(r["logprob"]) for r in rows)
    for key in pcfg.keys():
        assert len(passkey_prompt(tok, train_len, 0.5, key).forward_ids) == train_len


def test_bad_probe_values_are_refused(tok):
    with pytest.raises(PosbenchError, match=r"probe.depths\[1\]=1.5 is not in \[0, 1\]"):
        PasskeyConfig(depths=[0.0, 1.5])
    with pytest.raises(PosbenchError, match="probe.trials must be > 0, got 0"):
        PasskeyConfig(trials=0)
    with pytest.raises(PosbenchError, match="probe.lengths must be > 0, got -5"):
        PasskeyConfig(lengths=[-5])
    with pytest.raises(PosbenchError, match="probe.depths is empty"):
        PasskeyConfig(depths=[])
    shortest = (len(encode(tok, KEY_SENTENCE.format(key=71432))) + len(encode(tok, QUESTION))
                + len(encode(tok, "71432")) - 1)
    with pytest.raises(PosbenchError, match=f"probe length 20 is too short .* valid: probe.lengths >= {shortest}"):
        passkey_prompt(tok, 20, 0.5, 71432)
    assert PasskeyConfig().resolve_lengths(32) == [32, 64, 128, 256, 512]
    assert PasskeyConfig(seed=1).keys() == PasskeyConfig(seed=1).keys() != PasskeyConfig(seed=2).keys()


def test_probe_group_composes_with_eval_app():
    from hydra import compose, initialize_config_dir

    from posbench.config import conf_dir
    from posbench.eval.probes import PROBES, build_probe

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        assert compose(config_name="app_eval").get("probe") is None  # default: the perplexity ladder
        cfg = compose(config_name="app_eval", overrides=["probe=passkey"])
    assert build_probe(cfg.probe).options == PasskeyConfig()  # YAML and schema agree
    assert {p.stem for p in (conf_dir() / "probe").glob("*.yaml")} == set(PROBES.builtins)


# ---------------------------------------------------------------- end to end on a smoke run
@pytest.mark.slow
def test_passkey_cli_writes_and_merges_passkey_csv(smoke_run_copy):
    run = smoke_run_copy
    ladder = (run / "results.csv").read_bytes()
    args = ["eval", f"checkpoint={run}", "device=cpu", "probe=passkey", "probe.trials=3"]
    proc = posbench(*args, "probe.lengths=[64,128]")
    df = pd.read_csv(run / "passkey.csv")
    assert df.columns.tolist() == COLUMNS
    assert df[["length", "depth"]].values.tolist() == [[n, d] for n in (64, 128) for d in (0, 0.25, 0.5, 0.75, 1)]
    assert (df.status == "ok").all() and (df.trials == 3).all() and df.accuracy.between(0, 1).all()
    assert (df.accuracy == df.correct / df.trials).all() and (df.logprob < 0).all()
    assert (df.encoding == "alibi").all() and (df.train_len == 32).all() and df.config_hash.nunique() == 1
    assert "| alibi | 64 |" in proc.stdout and "passkey.csv" in proc.stdout
    assert (run / "results.csv").read_bytes() == ladder  # the ladder is left alone
    posbench(*args, "probe.lengths=[64]", "probe.depths=[0.5]", "probe.trials=5")
    merged = pd.read_csv(run / "passkey.csv").set_index(["length", "depth"])
    assert len(merged) == 10 and merged.loc[(64, 0.5), "trials"] == 5 and merged.loc[(64, 0.0), "trials"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["probe=pass"], "unknown probe 'pass'; valid choices: niah_multikey, niah_multivalue, passkey"),
    (["probe=passkey", "probe.depths=[0,1.5]"], "probe.depths[1]=1.5 is not in [0, 1]"),
    (["probe=passkey", "probe.trials=0"], "probe.trials must be > 0, got 0"),
    (["probe=passkey", "probe.lengths=[16,64]"], "probe length 16 is too short for the passkey prompt"),
])
def test_bad_probe_values_on_the_command_line(smoke_run, args, message):
    before = sorted(p.name for p in smoke_run.iterdir())
    proc = posbench("eval", f"checkpoint={smoke_run}", "device=cpu", *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"posbench: error: {message}")
    assert sorted(p.name for p in smoke_run.iterdir()) == before
