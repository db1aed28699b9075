"""STRING, attention sinks (StreamingLLM), LM-Infinite and Dual Chunk Attention: methods computed
from their parts, each a set of pairs with positions of its own."""

from __future__ import annotations

import math

import torch

from ..errors import PosbenchError
from .base import Extension, Part, near_part

STRING_FACTOR = 0.1 * math.log(2) + 1  # the reference's attention_factor on cos and sin
STRING_LOCAL = 128  # the reference's small_local_value


class FromParts(Extension):
    """A method whose window and group take their reference's defaults when None, then are checked."""

    kernel = "parts"

    def validate(self) -> None:
        window, group = self.defaults()
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "group", group)
        if self.bad_sizes():
            big, small = self.params
            raise PosbenchError(f"eval.extension={self.method} needs {self.need()}: eval.extension_window={big}, "
                                f"eval.extension_group={small}; got {self.window} and {self.group} "
                                f"(train_len {self.train_len})")

    def defaults(self) -> tuple[int, int]:
        raise NotImplementedError

    def bad_sizes(self) -> bool:
        return not (self.window > 0 and self.group >= 0)

    def need(self) -> str:
        big, small = self.params
        return f"{big} > 0 recent keys and {small} >= 0 starting keys"


class String(FromParts, name="string"):
    """**STRING** (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
    HKUNLP/STRING; shifted offset S = ``window``, local value W = ``group``): d < S as trained;
    d >= S: R(i - S + W)q . R(j)k, the distance d - S + W, so the far keys reuse the small, well
    trained distances. As the reference (``string_for_llama.py``), q and k are both multiplied by
    0.1 ln 2 + 1 (its ``attention_factor`` on cos and sin). Defaults: S = int(0.33 L) (its
    README's ``shifted_offset``), W = 128 (``small_local_value``), capped at S // 4 (at least 1)
    for short contexts. The reference's near part is a flash window of S + 1 keys (d <= S), so its
    key at d = S is counted in both parts; here each key is in one."""

    paper = "An et al. 2024, Why Does the Effective Context Length of LLMs Fall Short? (STRING); HKUNLP/STRING"

    params = ("S", "W")
    options = ("shift", "local")

    def defaults(self) -> tuple[int, int]:
        window = self.window if self.window is not None else int(0.33 * self.train_len)
        return window, self.group if self.group is not None else max(1, min(STRING_LOCAL, window // 4))

    def bad_sizes(self) -> bool:
        return not 0 < self.group < self.window

    def need(self) -> str:
        return "0 < W < S (the local value below the shifted offset)"

    def identity_at(self, length: int) -> bool:
        return False  # its factor scales every logit

    def attention_factor(self, T: int) -> float:
        return STRING_FACTOR

    def parts(self, T: int, device=None) -> list[Part]:
        pos, S, W = torch.arange(T, device=device), self.window, self.group
        return [near_part(pos, S), Part(pos - S + W, pos, lambda i, j: i - j >= S, lambda s, e: (0, max(0, e - S)))]


class StartAndRecent(FromParts):
    """A method where query i sees the first n keys (``group``) and those at d < W (``window``)."""

    params = ("W", "n")
    starts = 0  # n's default

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (j <= i) & ((j < self.group) | (i - j < self.window))

    def far_positions(self, pos: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def parts(self, T: int, device=None) -> list[Part]:
        pos, W, n = torch.arange(T, device=device), self.window, self.group
        q_far, k_far = self.far_positions(pos, T)
        return [near_part(pos, W), Part(q_far, k_far, lambda i, j: (i - j >= W) & (j < n), lambda s, e: (0, min(n, e)))]


class Sinks(StartAndRecent, name="sinks"):
    """**sinks** (StreamingLLM; Xiao et al., ICLR 2024, "Efficient Streaming Language Models with
    Attention Sinks", mit-han-lab/streaming-llm; n sinks = ``group``, W = ``window`` recent keys
    counting the query): query i sees the keys j < n and those at d < W; positions are the ones
    the reference's cache assigns (``enable_pos_shift``: a key at its index in the cache of
    ``start_size`` = n plus ``recent_size`` = W - 1 keys, the query after them): d < W as trained;
    a sink j < n at d >= W: R(min(i, n + W - 1))q . R(j)k. For a full window's perplexity this
    is exactly the reference's token-by-token streaming evaluation (``eval_long_ppl.py``) started
    at the window's first token. Defaults: n = 4 (the reference's ``start_size``), W = L - n (the
    cache and the query fill the trained context)."""

    paper = "Xiao et al. 2024 (ICLR), StreamingLLM; mit-han-lab/streaming-llm"

    starts = 4  # start_size (streaming-llm)
    options = ("window", "sinks")

    def defaults(self) -> tuple[int, int]:
        group = self.group if self.group is not None else self.starts
        return (self.window if self.window is not None else self.train_len - group), group

    def identity_at(self, length: int) -> bool:
        return length <= self.group + self.window

    def far_positions(self, pos: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return pos.clamp(max=self.group + self.window - 1), pos  # a sink's place in the reference's cache


class LMInfinite(StartAndRecent, name="lm_infinite"):
    """**LM-Infinite** (Han et al., NAACL 2024, "LM-Infinite: Zero-Shot Extreme Length
    Generalization for Large Language Models", Glaciohound/LM-Infinite; n_global = ``group``,
    local branch W = ``window``): the Lambda-shaped mask, query i seeing the keys j < n_global and
    those at d < W; d < W as trained; a starting key at d >= W: R(min(L, T - 1))q . k, its distance
    capped at ``limit_distance`` = L (the reference rotates such a query by the limit and leaves
    the starting keys unrotated). Defaults: W = L and n_global = 10 (its README's perplexity runs)."""

    paper = "Han et al. 2024 (NAACL), LM-Infinite; Glaciohound/LM-Infinite"

    starts = 10  # global_branch (LM-Infinite's README)
    options = ("window", "starts")

    def defaults(self) -> tuple[int, int]:
        group = self.group if self.group is not None else self.starts
        return (self.window if self.window is not None else self.train_len), group

    def identity_at(self, length: int) -> bool:
        return length <= self.window

    def far_positions(self, pos: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(pos, min(self.train_len, T - 1)), torch.zeros_like(pos)


class DualChunk(FromParts, name="dca"):
    """**Dual Chunk Attention** (``dca``; An et al., ICML 2024, "Training-Free Long-Context Scaling
    of Large Language Models", HKUNLP/ChunkLlama; chunk size C = ``window``, local window
    w = ``group``): the sequence cut into chunks of c = C - w tokens, every key at position j mod c;
    the query at i mod c for a key in its own chunk (intra-chunk), at min(i mod c + c, C) for a
    key in the chunk before (successive-chunk) and at min(2c - 1, C) for any earlier one
    (inter-chunk); past L, q and k times 0.05 ln(T / L) + 1 (the reference's ``get_mscale`` on
    cos and sin). Defaults: C = 3L // 4, w = L // 8 (``replace_with_chunkllama``)."""

    paper = "An et al. 2024 (ICML), Training-Free Long-Context Scaling (Dual Chunk Attention); HKUNLP/ChunkLlama"

    params = ("C", "w")
    options = ("chunk", "local")

    def defaults(self) -> tuple[int, int]:
        L = self.train_len
        return (self.window if self.window is not None else 3 * L // 4), (self.group if self.group is not None
                                                                           else L // 8)

    def bad_sizes(self) -> bool:
        return not 0 <= self.group < self.window

    def need(self) -> str:
        return "0 <= w < C (the local window inside the chunk)"

    def identity_at(self, length: int) -> bool:
        return length <= min(self.window - self.group, self.train_len)

    def attention_factor(self, T: int) -> float:
        return 0.05 * math.log(T / self.train_len) + 1.0 if T > self.train_len else 1.0

    def parts(self, T: int, device=None) -> list[Part]:
        """The intra-chunk, successive-chunk and inter-chunk parts (class docstring)."""
        pos = torch.arange(T, device=device)
        C, w = self.window, self.group
        c = C - w
        k_pos = pos % c
        succ_q = (pos % c + c).clamp(max=C)
        inter_q = torch.full_like(pos, min(2 * c - 1, C))
        return [Part(pos % c, k_pos, lambda i, j: i // c == j // c, lambda s, e: (s // c * c, e)),
                Part(succ_q, k_pos, lambda i, j: i // c == j // c + 1,
                     lambda s, e: (max(0, (s // c - 1) * c), (e - 1) // c * c)),
                Part(inter_q, k_pos, lambda i, j: i // c > j // c + 1,
                     lambda s, e: (0, max(0, ((e - 1) // c - 1) * c)))]
