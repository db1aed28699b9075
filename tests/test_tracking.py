"""RULER's variable tracking: prompts of exact length holding the chain in order, the same instance
at every length, an oracle of the chain scores 1 (and of the wrong order or chain 0), a uniform model
0 at -log(vocab) per token, and `posbench eval probe=variable_tracking` end to end."""

import math
import re

import pandas as pd
import pytest
import torch
from conftest import Oracle, posbench, tiny_model
from torch import nn

from posbench.data.corpus import train_tokenizer
from posbench.errors import PosbenchError
from posbench.eval.passkey import COLUMNS, FILLER, score_prompts
from posbench.eval.probe import Subject
from posbench.eval.tracking import (
    FIRST,
    HOP,
    QUESTION,
    TrackingConfig,
    VariableTracking,
    instances,
    tracking_prompt,
)

CPU = torch.device("cpu")
TEXT = [" ".join(FILLER) * 3, QUESTION.format(value=12345, count=5), FIRST.format(name="ABCDE", value=67890),
        HOP.format(name="FGHIJ", previous="KLMNO"), " ".join("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), "0 1 2 3 4 5 6 7 8 9"]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXT, 400, 1)


def encode(tok, text):
    return tok.encode(" " + text).ids


@pytest.mark.parametrize("chains", [1, 2])
def test_a_prompt_holds_each_chain_in_order_and_asks_for_the_first(tok, chains):
    inst = instances(TrackingConfig(trials=1, chains=chains, hops=3, seed=7))[0]
    assert len(inst.names) == chains and all(len(chain) == 4 for chain in inst.names)
    flat = [name for chain in inst.names for name in chain]
    assert len(set(flat)) == len(flat) and all(re.fullmatch("[A-Z]{5}", name) for name in flat)
    longest = max(len(encode(tok, s)) for s in FILLER)
    starts = []
    for depth in (0.0, 0.3, 0.7, 1.0):
        p = tracking_prompt(tok, 500, depth, inst)
        text = tok.decode(p.ids)
        a, b, c, d = inst.names[0]
        v = inst.values[0]
        asked = [f"VAR {a} = {v}.", f"VAR {b} = VAR {a}.", f"VAR {c} = VAR {b}.", f"VAR {d} = VAR {c}."]
        for chain in inst.assignments():
            at = [text.index(s) for s in chain]
            assert at == sorted(at) and all(text.count(s) == 1 for s in chain)  # each once, in chain order
        assert inst.assignments()[0] == asked
        assert text.endswith(" Question: Find all variables that are assigned the value "
                             f"{v} in the text above. Answer: According to the chain(s) of variable assignment "
                             f"in the text above, 4 variables are assigned the value {v}, they are:")
        assert tok.decode(p.answer) == f" {a} {b} {c} {d}"
        assert p.ids[p.key_start:p.key_start + len(encode(tok, asked[0]))] == encode(tok, asked[0])
        if chains == 1:  # only filler before the chain's first assignment: it sits at the depth
            assert abs(p.key_start - depth * p.filler) <= longest
            assert tok.decode(p.ids[:p.key_start]) == "" or tok.decode(p.ids[:p.key_start]).endswith(".")
        starts.append(p.key_start)
    assert starts == sorted(starts)
    assert " ".join(asked) in tok.decode(tracking_prompt(tok, 500, 1.0, inst).ids)  # depth 1: the chain in a row


@pytest.mark.parametrize("length", [233, 256, 301, 777])
def test_every_prompt_is_exactly_the_asked_length(tok, length):
    for inst in instances(TrackingConfig(trials=4, chains=2)):
        answer = encode(tok, inst.answer())
        for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
            p = tracking_prompt(tok, length, depth, inst)
            assert len(p.forward_ids) == length and p.forward_ids == p.ids + answer[:-1]
            pieces = sum(len(encode(tok, s)) for chain in inst.assignments() for s in chain)
            assert p.filler == length - len(answer) + 1 - pieces - len(encode(tok, inst.question()))


def test_a_row_at_length_l_uses_exactly_l_positions(tok):
    """A learned table of L entries is probed at L, and one entry short of L it cannot be."""
    probe = VariableTracking(TrackingConfig(lengths=[256], depths=[0.0, 1.0], trials=2))
    for max_len, status in ((256, "ok"), (255, "n/a: learned position table has 255 entries")):
        model = tiny_model("learned", {"max_len": max_len}, vocab=tok.get_vocab_size(), train_len=256)
        rows = probe.run(Subject(model, tok, CPU, None, 256), probe.lengths(256))
        assert [r["length"] for r in rows] == [256, 256] and all(r["status"].startswith(status) for r in rows)


def test_the_same_seed_gives_the_same_instance_at_every_length(tok):
    cfg = TrackingConfig(trials=5, chains=2, seed=3)
    assert instances(cfg) == instances(TrackingConfig(trials=5, chains=2, seed=3))
    assert instances(cfg) != instances(TrackingConfig(trials=5, chains=2, seed=4))
    assert instances(TrackingConfig(trials=3, seed=3)) != instances(TrackingConfig(trials=3, seed=4))
    for inst in instances(cfg):
        short, long = (tracking_prompt(tok, n, 0.5, inst) for n in (300, 1200))
        assert short.answer == long.answer and short.ids[-40:] == long.ids[-40:]  # same question and answer
        for text in (tok.decode(short.ids), tok.decode(long.ids)):
            for chain in inst.assignments():
                assert all(text.count(s) == 1 for s in chain)


class Uniform(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab)


def test_an_oracle_of_the_chain_scores_one_and_of_another_order_or_chain_zero(tok):
    cases = instances(TrackingConfig(trials=4, chains=2))
    prompts = [tracking_prompt(tok, 400, 0.25, inst) for inst in cases]
    vocab = tok.get_vocab_size()
    correct, logprob = score_prompts(Oracle(prompts, lambda p: p.answer, vocab), prompts, CPU, None, 4096)
    assert correct.all() and (logprob == pytest.approx(1 - math.log(math.e + vocab - 1), rel=1e-5))
    by_prompt = {id(p): inst for p, inst in zip(prompts, cases)}
    for wrong in (lambda inst: " ".join(reversed(inst.names[0])),  # the chain backwards
                  lambda inst: " ".join(inst.names[1])):  # the distracting chain
        oracle = Oracle(prompts, lambda p: encode(tok, wrong(by_prompt[id(p)])), vocab)
        correct, _ = score_prompts(oracle, prompts, CPU, None, 4096)
        assert not correct.any()


def test_an_oracle_scores_one_and_a_uniform_model_zero_at_minus_log_vocab_per_token(tok):
    options = TrackingConfig(lengths=[300, 450], depths=[0.0, 1.0], trials=3)
    probe, vocab = VariableTracking(options), tok.get_vocab_size()
    prompts = [tracking_prompt(tok, n, d, inst) for n in (300, 450) for d in (0.0, 1.0) for inst in instances(options)]
    oracle = probe.run(Subject(Oracle(prompts, lambda p: p.answer, vocab), tok, CPU, None, 150), probe.lengths(150))
    assert [(r["length"], r["depth"]) for r in oracle] == [(300, 0.0), (300, 1.0), (450, 0.0), (450, 1.0)]
    assert all(r["accuracy"] == 1.0 and r["correct"] == 3 and r["status"] == "ok" for r in oracle)
    uniform = probe.run(Subject(Uniform(vocab), tok, CPU, None, 150), probe.lengths(150))
    assert all(0 not in p.answer for p in prompts)  # argmax of a tie is token 0, never an answer token
    assert all(r["accuracy"] == 0.0 and r["correct"] == 0 for r in uniform)
    # logprob is the mean over the answer's tokens (as passkey's): their sum is count x -log(vocab)
    assert all(r["logprob"] == pytest.approx(-math.log(vocab), rel=1e-6) for r in uniform)
    count = len(prompts[0].answer)
    _, logprob = score_prompts(Uniform(vocab), prompts[:1], CPU, None, 4096)
    assert logprob[0] * count == pytest.approx(count * -math.log(vocab), rel=1e-6)


def test_bad_options_and_a_length_too_short_are_one_line(tok):
    cases = [(dict(chains=0), r"^probe.chains=0 is not a positive integer; valid: 1, 2, \.\.\. \(RULER's vt: "
                              r"chains=1, hops=4\)$"),
             (dict(hops=-2), r"^probe.hops=-2 is not a positive integer; valid: 1, 2, \.\.\."),
             (dict(depths=[0.0, 1.5]), r"^probe.depths\[1\]=1.5 is not in \[0, 1\] .*valid: e.g. \[0,0.25,0.5,0.75,1\]$"),
             (dict(trials=0), r"^probe.trials must be > 0, got 0$"),
             (dict(lengths=[]), r"^probe.lengths=\[\] is empty; valid: null")]
    for options, message in cases:
        with pytest.raises(PosbenchError, match=message) as err:
            TrackingConfig(**options)
        assert "\n" not in str(err.value)
    inst = instances(TrackingConfig(trials=1))[0]
    need = (sum(len(encode(tok, s)) for s in inst.assignments()[0]) + len(encode(tok, inst.question()))
            + len(encode(tok, inst.answer())) - 1)
    with pytest.raises(PosbenchError, match=rf"^probe length 60 is too short for 5 assignments, the question and "
                                            rf"the answer \({need} tokens\); valid: probe.lengths >= {need}$"):
        tracking_prompt(tok, 60, 0.5, inst)
    assert len(tracking_prompt(tok, need, 0.5, inst).forward_ids) == need  # the shortest: no filler


def test_the_yaml_and_the_options_agree():
    from hydra import compose, initialize_config_dir

    from posbench.config import conf_dir
    from posbench.eval.probes import PROBES, build_probe

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="app_eval", overrides=["probe=variable_tracking", "probe.hops=2"])
    probe = build_probe(cfg.probe)
    assert isinstance(probe, VariableTracking) and PROBES.class_of({"name": "variable_tracking"}) is VariableTracking
    assert probe.options == TrackingConfig(hops=2) and (probe.options.chains, TrackingConfig().hops) == (1, 4)


def test_eval_probe_variable_tracking_writes_its_rows(smoke_run_copy):
    run = smoke_run_copy
    proc = posbench("eval", f"checkpoint={run}", "probe=variable_tracking", "probe.lengths=[256,512]",
                    "probe.depths=[0,1]", "probe.trials=2", "device=cpu")
    rows = pd.read_csv(run / "variable_tracking.csv")
    assert rows.columns.tolist() == COLUMNS and len(rows) == 4
    assert sorted(zip(rows.length, rows.depth)) == [(256, 0), (256, 1), (512, 0), (512, 1)]
    assert (rows.trials == 2).all() and (rows.status == "ok").all() and rows.accuracy.between(0, 1).all()
    assert (rows.logprob < 0).all() and (rows.encoding == "alibi").all() and (rows.train_len == 32).all()
    assert "posbench: variable_tracking L=512" in proc.stderr and "variable_tracking.csv" in proc.stdout
