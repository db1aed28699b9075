"""`posbench bench`: training and evaluation speed and memory of every encoding, beside a peer.

Every figure comes from one run on one machine, each measurement in its own child process
so that its peak resident memory (:func:`peak_rss_mb`: Python, torch, model and activations) is
its own. The model is a preset of conf/model/ (``--model``, one or several): by default
``model=tiny``, the benchmark shape of the performance issue (4 layers, d_model 256, 8 heads,
FFN 1024), so the shipped CPU tables keep their meaning; vocabulary 8192 and no dropout for
every preset (the peer has none in the same places); bf16 autocast where the device has it.

* **train**: tokens/s of full training steps (forward, backward, gradient clipping, AdamW)
  at each train length, 4,096 tokens a step (batch = 4096 / train_len; ``--train-tokens``),
  after warm-up steps;
* **eval**: tokens/s and peak memory of one no-grad forward pass scoring 16,384 tokens
  (batch = 16384 / length windows; ``--eval-tokens``), the way ``posbench eval`` runs, after a
  warm-up pass at 1,024 tokens. Fewer tokens make a quick look on a slow machine (and the
  tests); bench.md states the counts each table ran with;
* **peer**: the same figures for x-transformers (``pip install -e ".[bench]"``) where it has
  the encoding, at whichever of its two attention settings (``attn_flash`` on or off) is
  faster, and the ratio posbench / x-transformers. The peer has posbench's shape and
  parameter count: head dimension d_model / heads (``attn_dim_head``; its default is 64),
  rotary over the whole head (``rotary_emb_dim``; its default is half) and tied input and
  output embeddings (``tie_embedding``); both counts are in every row and table;
* **trainer** (``--trainer``; on by default on a GPU): each training figure of posbench's also
  through the real trainer, ``posbench train`` at the same shape, batch and precision on the
  packaged corpus, its tokens/s the median of its logged windows after compiling and warm-up
  (:func:`~posbench.bench.children._trainer_child`), beside the loop's and as a ratio; on a GPU
  a target holds it within 5% of the loop, so the command a user runs cannot fall behind the
  figure the bench reports unseen;
* **allocator**: every implementation is measured under each setting of ``--malloc``: glibc's
  default (``system``) and posbench's (``posbench``, :func:`posbench.model.build.keep_freed_memory`),
  so each ratio compares the two libraries in the same environment;
* **FLOP/s** (:func:`flops_per_token`): training FLOPs per token

      6 N + 6 n_layers d_model T,    N = n_layers (4 d_model^2 + 2 d_model d_ff) + vocab d_model,

  N the matmul parameters (q, k, v, output projection, the two FFN layers, and the tied output
  layer; the embedding lookup is no matmul), 2 FLOPs a multiply-add, forward and backward
  3x the forward; the second term is attention's QK^T and AV over the keys a causal query
  sees, T / 2 on average (2 products x 2 d_model T / 2 x 3). PaLM's MFU (Chowdhery et al.
  2022, app. B) counts all T keys, 12 n_layers d_model T: its figures read higher by
  6 n_layers d_model T over this total (5% at model=base, T=512). Times tokens/s, as a fraction of
  the matmul peak in the precision the run uses (bf16 autocast where the device has it, else
  fp32), measured on n^3 products in the same run (n = 2048 on a CPU, 8192 on a GPU; the best
  round of several, at the start and at the end);
* **MFU** (GPU): the same FLOP/s as a fraction of the GPU's datasheet dense bf16 peak
  (:data:`DENSE_BF16_TFLOPS`: 989.4 TFLOP/s for an H100 SXM and an H200, 312 for an A100), beside
  the fraction of the measured matmul peak; a GPU not in the table gets "n/a" and a line
  saying so;
* **kernels** (``--kernels``): one attention layer at 8,192 tokens with an ALiBi bias, by
  kernel: SDPA without bias (the floor), the bias built per query chunk, Toeplitz slices of
  one bias, and flex attention with the bias as ``score_mod`` (compiled; compile time apart).

Children run under a 16 GiB address-space cap, so a kernel that materialises a
(heads, T, T) matrix fails with "out of memory" instead of swapping the machine.

``--device cuda`` measures the same on a GPU, with the defaults of a GPU training bench:
training only (``--eval-lens`` adds evaluation), at T=512, 32,768 tokens a step (64 windows:
enough that the GPU is not waiting on kernel launches), bf16 autocast, fused AdamW, and each
implementation's loss (model and cross-entropy) under ``torch.compile`` (``--no-compile``:
eager); posbench's relative biases run through SDPA with the bias as a float mask there, as
in training, and through flex attention (:func:`posbench.model.attention.flex_causal`) only
under ``POSBENCH_FLEX=1``. x-transformers runs with ``attn_flash`` on, its
fast setting on a GPU (but with T5's bias, which it refuses there), compiled the same way. Peak
memory is the GPU's high-water mark of allocated memory (``torch.cuda.max_memory_allocated``)
instead of resident memory; there is no address-space cap (CUDA reserves more than 16 GiB of
it) and only glibc's malloc (``system``) unless ``--malloc`` says otherwise. A figure is the
median of the timed steps, each timed by CUDA events around it, after the compiling steps
(their time is the ``compile s`` column) and the warm-up steps. Compiling is CPU work and most
of a GPU child's time, so ``--jobs N`` runs N children side by side, in waves of N: a wave's
children compile at once, wait until all of them have compiled (a barrier of marker files), then
take turns (a lock file) for their warm-up and timed steps, so no two are timed together and
nothing compiles beside a timed figure; the next wave starts when the last child ends. On a GPU
a training figure is the median of 50 timed steps (``--steps``). ``--deadline`` starts no child
past a time, and bench.csv, bench.json and bench.md are rewritten as each row finishes, so a run
cut short keeps what it measured. The run the GPU
figures come from is in results/bench/gpu/.

The package: :mod:`.children` (what one measurement runs, in its own process), :mod:`.run`
(the run of every figure), :mod:`.tables` (bench.md and the targets), :mod:`.cli` (the command).
"""

from __future__ import annotations

from .children import (  # noqa: F401
    DEFAULT_TOKENS,
    DENSE_BF16_TFLOPS,
    EVAL_TOKENS,
    GPU_TRAIN_TOKENS,
    MATMUL_N,
    MEMORY_CAP,
    MODEL_OPTION_ENTRIES,
    PEER_ENCODINGS,
    PEER_NO_FLASH,
    TRAIN_TOKENS,
    VOCAB,
    _peer_model,
    _posbench_model,
    datasheet_tflops,
    error_line,
    flops_per_token,
    mfu,
    model_names,
    model_shape,
    peak_rss_mb,
    run_child,
    split_entry,
)
from .cli import main  # noqa: F401
from .run import MALLOCS, bench, measured  # noqa: F401
from .tables import GPU_MFU_TARGETS, STATIC_BIAS_MFU, gpu_targets, tables, targets  # noqa: F401
