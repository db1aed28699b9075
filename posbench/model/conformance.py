"""The conformance checks every encoding passes, built-in or plugin: one source of truth.

``check_encoding(cls)`` runs them all on small models and raises :class:`ConformanceError`
naming the first that fails; ``posbench check pkg.module:Class`` runs them from the command
line; posbench's own tests call the same checks for every built-in encoding
(``tests/test_encodings.py``), so a plugin is held to exactly the zoo's standard.

=====================  ======================================================================
check                  what it asserts
=====================  ======================================================================
``causality``          changing tokens after position i never changes the logits up to i
``kernels``            every attention kernel (explicit, SDPA, Toeplitz slices, query chunks,
                       with and without gradients) equals plain fp32 attention
``layer_invariant``    the claim ``layer_invariant_bias``: a forward that shares layer 0's
                       bias equals one that rebuilds every layer's
``relative``           the claim ``relative_bias``: the bias at positions shifted by a constant
                       is the same (the Toeplitz slices rely on it)
``reads_positions``    the claim ``reads_positions``: gapped positions change the output
                       exactly when the encoding says it reads them
``bf16``               under bf16 autocast the loss is finite and every parameter of the
                       encoding and of the model options gets a finite, non-zero gradient (it can
                       learn; in a model with ``model.layers``, some parameter of the encoding,
                       its other layers' having no attention to act in), at its init or
                       after one step where a factor starts at zero
``long``               a forward at 16x the training length is finite (or the encoding refuses
                       with a PositionRangeError, as a learned table must), and no tensor any
                       op makes exceeds the chunked kernels' bound: the larger of pair_cost x
                       query chunk x T and the token-wise activations, twice
=====================  ======================================================================

A flag an encoding does not claim costs only speed (the kernels take the slow, always-right
path), so only claims are checked; a wrong claim gives wrong numbers, and the check fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import ModelConfig
from ..encodings import REGISTRY, PositionEncoding, PositionRangeError, encoding_class
from ..errors import PosbenchError
from ..plugins import import_target
from .attention import causal_attention, cumulative_decay, layer_window, reference_attention
from .transformer import LanguageModel

VOCAB = 64


class ConformanceError(AssertionError):
    """An encoding failed a conformance check; the message names the check and what differed."""


def resolve(encoding: str | type[PositionEncoding]) -> type[PositionEncoding]:
    """A class, a registered name, or an import path (``pkg.module:Class`` / ``pkg.module.Class``)."""
    if isinstance(encoding, type):
        if not issubclass(encoding, PositionEncoding):
            raise PosbenchError(f"{encoding!r} is not a subclass of posbench.encodings.PositionEncoding")
        return encoding
    if encoding in REGISTRY:
        return REGISTRY[encoding]
    if ":" in encoding or "." in encoding:
        cls = import_target(encoding, f"encoding {encoding!r}")
        return resolve(cls)
    return encoding_class({"name": encoding})


def _model(cls, options, *, d_model=32, n_layers=2, n_heads=4, d_ff=64, chunk=8, train_len=16, perturb=False,
           model: Mapping[str, Any] | None = None):
    """A small model; ``perturb`` moves the encoding's parameters off their init so every term
    counts (a table that starts at zero would hide a wrong flag); ``model``: more ModelConfig
    options (a model option such as ``length_scaling`` checked with the encoding)."""
    torch.manual_seed(0)
    model = dict(model or {})
    if set(model.get("layers", "a")) != {"a"}:  # room for the MLPs to give up the layers' parameters (mlp_width),
        d_ff = model.pop("d_ff", 4 * d_ff)  # and layers enough for every type of the pattern
        n_layers = max(n_layers, len(model["layers"]))
    cfg = ModelConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=d_ff, attn_chunk=chunk, **model)
    net = LanguageModel(cfg, VOCAB, cls.build(LanguageModel.dims(cfg, train_len, VOCAB), dict(options)))
    if perturb:
        with torch.no_grad():
            for p in net.encoding.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(p.dtype))
    return net.eval()


def _tokens(B: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def _fail(check: str, cls: type, message: str) -> None:
    raise ConformanceError(f"{cls.name or cls.__name__}: {check}: {message}")


# ---- the checks ------------------------------------------------------------------------------

def check_causality(cls, options, model=None) -> None:
    net, x = _model(cls, options, perturb=True, model=model), _tokens(2, 16, 0)
    y = x.clone()
    y[:, 10:] = _tokens(2, 6, 1)
    with torch.no_grad():
        a, b = net(x), net(y)
    if not torch.allclose(a[:, :10], b[:, :10], atol=1e-5):
        _fail("causality", cls, f"changing tokens 10.. changed the logits of tokens < 10 by up to "
                                f"{(a[:, :10] - b[:, :10]).abs().max():.2e}: a query sees keys after it")


def check_kernels(cls, options, model=None) -> None:
    net = _model(cls, options, perturb=True, model=model)
    attention = [b.attn for b in net.blocks if b.kind == "a"]
    enc, sink = net.encoding, attention[0].sinks if attention else None  # model.sinks: learned sink logits
    if sink is not None:
        sink = sink.detach() + torch.linspace(-1, 1, len(sink))  # far from 0, so a sink on the wrong head shows
    for grad, T, chunk in [(True, 37, 64), (False, 37, 64), (False, 37, 10), (True, 150, 64)]:
        torch.manual_seed(1)
        q, k, v = (torch.randn(2, enc.dims.n_heads, T, enc.dims.head_dim) for _ in range(3))
        pos = torch.arange(T)
        q, k = enc.rotate(q, k, pos, 1)
        with torch.no_grad():  # the gates of a layer input, summed as the model sums them
            decay = cumulative_decay(enc, torch.randn(2, T, enc.dims.d_model), 1)
        window = layer_window(enc, 1, (model or {}).get("window", 0))
        with torch.set_grad_enabled(grad):
            out = causal_attention(q, k, v, enc, pos, 1, chunk_size=chunk, cache={}, decay=decay, window=window,
                                   sink=sink)
            ref = reference_attention(q, k, v, enc, pos, 1, decay=decay, window=window, sink=sink)
        if not torch.allclose(out.float(), ref, atol=1e-5, rtol=1e-5):
            _fail("kernels", cls, f"the attention kernel at T={T}, query chunk {chunk}, grad={grad} differs from "
                                  f"plain fp32 attention by up to {(out.float() - ref).abs().max():.2e}")


def _per_layer_forward(model: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """The model's forward with nothing shared between layers (a fresh cache per layer, holding
    only the model's length scaling)."""
    from .length_scaling import key_counts

    positions = torch.arange(x.shape[1])
    h = model.drop(model.encoding.embed(model.tok_emb(x) * model.emb_scale, positions, x))
    scaling = ({"length_scaling": model.length_scaling, "key_counts": key_counts(x.shape[1])}
               if model.length_scaling is not None else {})
    for layer, block in enumerate(model.blocks):
        h = block(h, model.encoding, positions, layer, dict(scaling))
    return model.ln_f(h) @ model.tok_emb.weight.t()


def check_layer_invariant(cls, options, model=None) -> None:
    x = _tokens(2, 16, 3)
    for chunk in (1024, 7):  # one (H, T, T) bias per forward; Toeplitz slices or per-chunk biases
        net = _model(cls, options, chunk=chunk, perturb=True, model=model)
        if not net.encoding.layer_invariant_bias:  # the instance's claim (an option may change it)
            return
        with torch.no_grad():
            got, want = net(x), _per_layer_forward(net, x)
        if not torch.allclose(got, want, atol=1e-5):
            _fail("layer_invariant", cls, "claims layer_invariant_bias, but a forward reusing layer 0's bias "
                                          f"differs from one building every layer's by {(got - want).abs().max():.2e} "
                                          "(set layer_invariant_bias = False)")


def check_relative(cls, options, model=None) -> None:
    enc = _model(cls, options, perturb=True, model=model).encoding
    if not enc.relative_bias:
        return
    q_pos, k_pos = torch.arange(40, 60), torch.arange(0, 60)
    with torch.no_grad():
        for layer in range(enc.dims.n_layers):
            a, b = enc.bias(q_pos + 333, k_pos + 333, layer), enc.bias(q_pos, k_pos, layer)
            if not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
                _fail("relative", cls, "claims relative_bias, but shifting both positions by 333 changes the bias "
                                       f"of layer {layer} by {(a - b).abs().max():.2e} (set relative_bias = False)")


def check_reads_positions(cls, options, model=None) -> None:
    """The claim is the encoding's: a sliding window (``model.window``) is measured in positions, so
    it reads them whatever the encoding does, and the model is checked without it."""
    model = {k: v for k, v in (model or {}).items() if k != "window"}
    net, x = _model(cls, options, perturb=True, train_len=16, model=model), _tokens(2, 24, 1)
    gapped = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:24].sort().values
    try:
        with torch.no_grad():
            ordinary, other = net(x), net(x, positions=gapped)
    except PositionRangeError:
        return  # a table too short for position 63: it reads positions (and says so by refusing)
    changed = not torch.allclose(ordinary, other, atol=1e-5)
    if changed != net.encoding.reads_positions:
        _fail("reads_positions", cls, f"says reads_positions = {net.encoding.reads_positions}, but gapped positions "
                                      f"{'change' if changed else 'do not change'} the output")


def check_bf16(cls, options, model=None) -> None:
    """Where a parameter gets no gradient at its init because it is multiplied by one that starts at
    zero (TAPE's reference zeroes W_up, so W_x and W_down see none until it moves), the gradients are
    taken again after one sign step of every parameter."""
    net = _model(cls, options, model=model).train()
    x = _tokens(2, 17, 4)
    scaling = net.length_scaling.named_parameters("length_scaling") if net.length_scaling is not None else []
    params = [*net.encoding.named_parameters(), *scaling, *net.option_parameters()]
    for step in range(2):
        net.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(x[:, :-1], targets=x[:, 1:])
        loss.backward()
        if not torch.isfinite(loss):
            _fail("bf16", cls, f"the loss under bf16 autocast is {loss.item()}")
        if step or all(p.grad is None or p.grad.abs().sum() > 0 for _, p in params):
            break
        with torch.no_grad():  # an Adam-sized first step: a factor at zero moves and lets gradients through
            for p in net.parameters():
                if p.grad is not None:
                    p -= 1e-2 * p.grad.sign()
    hybrid = any(block.kind != "a" for block in net.blocks)
    encoding_names = {name for name, _ in net.encoding.named_parameters()}
    for name, param in params:
        if hybrid and name in encoding_names:
            continue  # the encoding's parameters of layers that are not attention have nothing to act on
        if param.grad is None or not torch.isfinite(param.grad).all() or param.grad.abs().sum() == 0:
            _fail("bf16", cls, f"parameter {name!r} gets no finite non-zero gradient: it cannot learn")
    if hybrid and list(net.encoding.parameters()) and not any(
            p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
            for p in net.encoding.parameters()):
        _fail("bf16", cls, "no parameter of the encoding gets a finite non-zero gradient in the model with "
                           f"model.layers={net.cfg.layers!r}: its attention layers do not use it")


def _long_model(cls, options, model=None):
    return _model(cls, options, d_model=64, n_layers=2, n_heads=4, d_ff=128, chunk=64, train_len=128, model=model)


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.op = t.numel(), str(func)
        return out


def check_long(cls, options, model=None) -> None:
    """One forward at 16x the training length (train_len 128 -> 2048 tokens, query chunks of 64):
    finite logits, and no tensor over the chunked bound."""
    net, T = _long_model(cls, options, model), 16 * 128
    enc, cfg = net.encoding, net.cfg
    bound = 2 * max(enc.pair_cost() * cfg.attn_chunk * T,  # one query chunk's scores or bias
                    T * max(cfg.d_ff, 3 * cfg.d_model, VOCAB))  # the token-wise activations
    tracker = _LargestTensor()
    try:
        with torch.no_grad(), tracker:
            logits = net(_tokens(1, T, 5))
    except PositionRangeError:
        return  # refuses clearly, as a learned table must
    if not torch.isfinite(logits).all():
        _fail("long", cls, f"logits at 16x the training length (T={T}) are not finite")
    if tracker.largest > bound:
        _fail("long", cls, f"at T={T} an op ({tracker.op}) made a tensor of {tracker.largest:,} elements, over the "
                           f"chunked bound {bound:,}: compute content- or position-dependent terms per query chunk "
                           "(and set pair_cost to the values held per (query, key) pair)")


CHECKS: dict[str, Callable[[type, Mapping], None]] = {
    "causality": check_causality, "kernels": check_kernels, "layer_invariant": check_layer_invariant,
    "relative": check_relative, "reads_positions": check_reads_positions, "bf16": check_bf16,
    "long": check_long,
}


def check_encoding(encoding: str | type[PositionEncoding], options: Mapping[str, Any] | None = None,
                   checks: list[str] | None = None, model: Mapping[str, Any] | None = None) -> list[str]:
    """Run ``checks`` (default: all of :data:`CHECKS`) on ``encoding`` built with ``options``
    (default: its constructor's defaults), in models with the ModelConfig options ``model``
    (e.g. ``{"length_scaling": "ssmax"}``: a model option is held to the same checks with every
    encoding). -> the names of the checks run; raises :class:`ConformanceError` at the first that
    fails."""
    cls = resolve(encoding)
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise PosbenchError(f"unknown check {unknown[0]!r}; valid choices: {', '.join(CHECKS)}")
    threads = torch.get_num_threads()
    try:
        for name in names:
            CHECKS[name](cls, dict(options or {}), dict(model or {}))
    finally:
        torch.set_num_threads(threads)
    return names


# ---- inference-time methods (posbench.methods) --------------------------------------------------
# ``check_method(ext_or_name, ...)``: what every method, built-in or plugin, is held to on a small
# trained-shape rope model: where it says it leaves the model as trained (``identity_at``), it does;
# it is causal; it runs under bf16 autocast; and it runs on a tiny random Hugging Face Llama through
# transformers' attention interface (where transformers is installed).

METHOD_LEN = 16  # the small model's trained context


def _method(method, window=None, group=None):
    from ..methods import Extension

    return method if isinstance(method, Extension) else Extension(method, window, group, METHOD_LEN)


@dataclass(frozen=True)
class ScalingUnderCheck:
    """A RoPE scaling (``eval.rope_scaling``, :mod:`posbench.methods.rope`) held to the method checks:
    it leaves the model as trained wherever its s is 1, and is applied as a rotary model (trained or
    pretrained) applies it, through ``encoding.scaled(kind, factor)``."""

    kind: str
    factor: float | None = None

    @property
    def label(self) -> str:
        return f"eval.rope_scaling={self.kind}"

    def identity_at(self, length: int) -> bool:
        from ..methods import scaling_factor

        return scaling_factor(self.kind, self.factor, length, METHOD_LEN) == 1.0

    def within(self, encoding):
        return encoding.scaled(self.kind, self.factor)


def _within(encoding, ext):
    """The block in which ``encoding`` runs under ``ext``: a method (``extended``) or a scaling."""
    return ext.within(encoding) if isinstance(ext, ScalingUnderCheck) else encoding.extended(ext)


def _rope_model():
    return _model(resolve("rope"), {}, train_len=METHOD_LEN, perturb=True)


def check_method_identity(ext) -> None:
    net, x = _rope_model(), _tokens(2, 48, 6)
    lengths = [T for T in (8, METHOD_LEN, 24, 48) if ext.identity_at(T)]
    for T in lengths:
        with torch.no_grad():
            plain = net(x[:, :T])
            with _within(net.encoding, ext):
                got = net(x[:, :T])
        if not torch.allclose(got, plain, atol=1e-4):
            _fail_method("identity", ext, f"says it leaves the model as trained at {T} tokens (identity_at), but "
                                          f"its logits differ by up to {(got - plain).abs().max():.2e}")


def check_method_causality(ext) -> None:
    net, x = _rope_model(), _tokens(2, 40, 7)
    y = x.clone()
    y[:, 25:] = _tokens(2, 15, 8)
    with torch.no_grad(), _within(net.encoding, ext):
        a, b = net(x), net(y)
    if not torch.allclose(a[:, :25], b[:, :25], atol=1e-5):
        _fail_method("causality", ext, f"changing tokens 25.. changed the logits of tokens < 25 by up to "
                                       f"{(a[:, :25] - b[:, :25]).abs().max():.2e}: a query sees keys after it")


def check_method_bf16(ext) -> None:
    net, x = _rope_model(), _tokens(2, 40, 9)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _within(net.encoding, ext):
        logits = net(x)
    if not torch.isfinite(logits).all():
        _fail_method("bf16", ext, "logits under bf16 autocast are not finite")


def check_method_pretrained(ext) -> None:
    """On a tiny random Llama (transformers), through the attention interface posbench gives pretrained
    models: finite logits at 3x its context, and the model as loaded where the method says so."""
    try:
        import transformers
    except ImportError:
        return
    from .pretrained import PretrainedLM

    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=METHOD_LEN)).eval()
    model = PretrainedLM(llama, "tiny-llama", "random")
    x = _tokens(1, 3 * METHOD_LEN, 10)
    with torch.no_grad():
        plain = model.logits(model.hidden(x))
        with _within(model.encoding, ext):
            got = model.logits(model.hidden(x))
    if not torch.isfinite(got).all():
        _fail_method("pretrained", ext, f"logits on a random Llama at {x.shape[1]} tokens are not finite")
    if ext.identity_at(x.shape[1]) and not torch.allclose(got, plain, atol=1e-4):
        _fail_method("pretrained", ext, "says it leaves the model as trained, but a random Llama's logits differ by "
                                        f"up to {(got - plain).abs().max():.2e}")


def _fail_method(check: str, ext, message: str) -> None:
    raise ConformanceError(f"{ext.label}: {check}: {message}")


METHOD_CHECKS: dict[str, Callable] = {"identity": check_method_identity, "causality": check_method_causality,
                                      "bf16": check_method_bf16, "pretrained": check_method_pretrained}


def check_method(method, window: int | None = None, group: int | None = None,
                 checks: list[str] | None = None) -> list[str]:
    """Run ``checks`` (default: all of :data:`METHOD_CHECKS`) on the inference-time method ``method``
    (a name, an import path, an Extension, or a :class:`ScalingUnderCheck`) with ``window`` and
    ``group`` at a trained context of :data:`METHOD_LEN` tokens -> the names of the checks run;
    ConformanceError at the first that fails."""
    names = list(METHOD_CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in METHOD_CHECKS]
    if unknown:
        raise PosbenchError(f"unknown check {unknown[0]!r}; valid choices: {', '.join(METHOD_CHECKS)}")
    ext = method if isinstance(method, ScalingUnderCheck) else _method(method, window, group)
    threads = torch.get_num_threads()
    try:
        for name in names:
            METHOD_CHECKS[name](ext)
    finally:
        torch.set_num_threads(threads)
    return names
