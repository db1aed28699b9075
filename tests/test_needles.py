"""RULER's needles with distractors: prompts with known answers, an oracle that reads the right
needle scores 1 and one that reads a distractor 0, and `posbench eval probe=niah_multikey` end to end."""

import pandas as pd
import pytest
import torch
from conftest import Oracle, posbench

from posbench.data.corpus import train_tokenizer
from posbench.errors import PosbenchError
from posbench.eval.needles import (
    NEEDLE,
    QUESTION,
    WORDS,
    NiahMultiKey,
    NiahMultiValue,
    answer_text,
    instances,
    needles_prompt,
)
from posbench.eval.passkey import FILLER, score_prompts

CPU = torch.device("cpu")
TEXT = [" ".join(FILLER) * 3, NEEDLE.format(key="apple", value=1234567), QUESTION.format(key="river"),
        " ".join(WORDS), "Numbers 0 1 2 3 4 5 6 7 8 9, and 2024."]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXT, 400, 1)


def decode(tok, ids):
    return tok.decode(ids)


@pytest.mark.parametrize("cls", [NiahMultiKey, NiahMultiValue])
@pytest.mark.parametrize("length", [200, 333])
def test_prompts_hold_the_needles_and_ask_for_the_right_key(tok, cls, length):
    options = cls.Options(trials=5)
    for inst in instances(options):
        assert len({k for k, _ in inst.needles()}) == options.keys  # the distractors' keys differ from the asked
        for depth in (0.0, 0.5, 1.0):
            p = needles_prompt(tok, length, depth, inst)
            assert len(p.forward_ids) == length  # exactly the asked positions
            text = decode(tok, p.ids)
            for key, value in inst.needles():
                assert text.count(NEEDLE.format(key=key, value=value)) == 1, (key, value)
            assert text.endswith(QUESTION.format(key=inst.key))
            shown = sorted(inst.values, key=lambda v: text.index(f"is: {v}."))  # the values in text order
            assert decode(tok, p.answer).strip() == answer_text(shown)
            asked = NEEDLE.format(key=inst.key, value=inst.values[0])
            before = [NEEDLE.format(key=k, value=v) for k, v in inst.needles() if text.index(NEEDLE.format(
                key=k, value=v)) < text.index(asked)]  # needles placed before the asked key's first
            filler_before = p.key_start - sum(len(tok.encode(" " + n).ids) for n in before)
            assert abs(filler_before - depth * p.filler) <= max(len(tok.encode(" " + s).ids) for s in FILLER)


def test_an_oracle_of_the_asked_needle_scores_one_and_of_a_distractor_zero(tok):
    options = NiahMultiKey.Options(trials=6)
    cases = instances(options)
    prompts = [needles_prompt(tok, 240, 0.5, inst) for inst in cases]
    right = Oracle(prompts, lambda p: p.answer, tok.get_vocab_size())
    correct, _ = score_prompts(right, prompts, CPU, None, 4096)
    assert correct.all()
    by_prompt = {id(p): inst for p, inst in zip(prompts, cases)}
    distractor = Oracle(prompts, lambda p: tok.encode(" " + str(by_prompt[id(p)].distractors[0][1])).ids,
                        tok.get_vocab_size())
    correct, _ = score_prompts(distractor, prompts, CPU, None, 4096)
    assert not correct.any()


def test_options_and_a_length_too_short_are_one_line(tok):
    with pytest.raises(PosbenchError, match=r"probe.keys=65 is more than the 64 key words; valid: 1..64"):
        NiahMultiKey.Options(keys=65)
    with pytest.raises(PosbenchError, match=r"probe.depths=\[2\] must be a non-empty list of depths in \[0, 1\]"):
        NiahMultiKey.Options(depths=[2])
    with pytest.raises(PosbenchError, match=r"probe length 40 is too short for 4 needles and the question"):
        needles_prompt(tok, 40, 0.5, instances(NiahMultiKey.Options(trials=1))[0])


def test_eval_probe_niah_multikey_writes_its_rows(smoke_run_copy):
    run = smoke_run_copy
    proc = posbench("eval", f"checkpoint={run}", "probe=niah_multikey", "probe.lengths=[256,512]", "probe.depths=[0,1]",
                    "probe.trials=3", "device=cpu")
    rows = pd.read_csv(run / "niah_multikey.csv")
    assert sorted(zip(rows.length, rows.depth)) == [(256, 0), (256, 1), (512, 0), (512, 1)]
    assert (rows.trials == 3).all() and (rows.status == "ok").all() and rows.accuracy.between(0, 1).all()
    assert (run / "niah_multikey.png").is_file() and "posbench: niah_multikey L=512" in proc.stderr
