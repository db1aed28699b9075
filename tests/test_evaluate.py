"""The perplexity ladder scores the same tokens at every length."""

import math

import numpy as np
import pytest
import torch

from posbench.config import EvalConfig
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.evaluate import perplexity_ladder, scored_tokens
from posbench.model import LanguageModel, ModelConfig


def test_token_budget_is_a_multiple_of_the_longest_length():
    tokens = np.arange(10_000)
    assert scored_tokens(tokens, [16, 64, 256], 5000, "validation") == 4864  # 19 * 256
    with pytest.raises(PosbenchError, match="eval length 20000 is longer than the 9999 validation tokens"):
        scored_tokens(tokens, [16, 20000], 5000, "validation")
    with pytest.raises(PosbenchError, match="eval.max_tokens=100 is smaller than the longest eval length 256"):
        scored_tokens(tokens, [256], 100, "validation")


def test_ladder_matches_direct_computation():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, d_ff=64)
    model = LanguageModel(cfg, 50, build_encoding({"name": "alibi"}, LanguageModel.dims(cfg, 8)))
    tokens = np.random.default_rng(0).integers(0, 50, 1000).astype(np.int32)
    ecfg = EvalConfig(lengths=[8, 32], max_tokens=200, batch_tokens=64)
    rows = perplexity_ladder(model, tokens, [8, 32], ecfg, torch.device("cpu"), None)
    assert [r["tokens"] for r in rows] == [192, 192]
    ids = torch.from_numpy(tokens[:193].astype(np.int64))
    with torch.no_grad():
        nll = model.loss(ids[:-1].view(-1, 32), ids[1:].view(-1, 32), reduction="sum").item() / 192
    assert rows[1]["nll"] == pytest.approx(nll, rel=1e-5)
    assert rows[1]["ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
