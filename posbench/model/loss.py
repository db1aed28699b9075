"""Output layer and cross-entropy in one pass over row slices, gradients made in the forward.

The training loss is ``mean_i CE(h_i W^T, y_i)`` over N = batch x train_len tokens. Done
plainly, autograd keeps the (N, vocab) logits, their fp32 copy and log-softmax, and the
backward makes two more such tensors: at the default 4,096 tokens x 8k vocabulary that is
five 134 MB passes, which on a 2-core CPU cost more than the matmuls around them.

Since the loss is the last op, d loss / d logits = (softmax - onehot) / N is known as soon as
the logits are. So the forward walks ``rows`` tokens at a time: logits (bf16 matmul under
autocast, as plainly), fp32 log-sum-exp and loss, then the slice's gradient, turned at once
into d/dh = G W and accumulated d/dW += G^T h; the backward only scales them by the
incoming gradient. The matmuls are the same as autograd's; no (N, vocab) tensor exists
(the same idea as Liger-Kernel's fused linear cross-entropy).

It saves time and most of the peak memory at long training windows; the measurements are in
results/bench/ (``posbench bench``).
"""

from __future__ import annotations

import torch


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, rows):
        kind = hidden.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
        w = weight.to(dtype)
        valid = targets >= 0  # a negative target (a task's prompt, padding) is skipped
        n = valid.sum().clamp(min=1).float()  # a tensor: no host sync, so compiled steps keep one graph
        keep = valid.float()
        targets = targets.clamp(min=0)
        grad_h = torch.empty_like(hidden, dtype=torch.float32)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for i in range(0, targets.numel(), rows):
            h, y, m = hidden[i:i + rows].to(dtype), targets[i:i + rows], keep[i:i + rows]
            logits = (h @ w.t()).float()  # (r, V)
            rows_ = torch.arange(len(y), device=y.device)
            target = logits[rows_, y]
            top = logits.amax(dim=-1, keepdim=True)
            grad = logits.sub_(top).exp_()  # exp(logit - max), in place: one exp pass
            norm = grad.sum(dim=-1, keepdim=True)
            total += ((top.squeeze(1) + norm.squeeze(1).log() - target) * m).double().sum()
            grad = grad.mul_(m[:, None] / (norm * n))  # softmax / n, 0 on skipped rows
            grad[rows_, y] -= m / n  # d loss / d logits
            grad = grad.to(dtype)  # the matmul dtype
            grad_h[i:i + rows] = grad @ w
            grad_w += (grad.t() @ h).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        return (total / n).float()

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad_out).to(ctx.dtypes[0]), (grad_w * grad_out).to(ctx.dtypes[1]), None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         rows: int = 1024) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` (hidden (..., D), weight (V, D), targets (...,)),
    equal to ``F.cross_entropy(hidden @ weight.T, targets, ignore_index=<any negative>)`` with its
    gradients, in slices of ``rows`` tokens: the mean over the targets >= 0, found on the device
    (no ``.any()`` on the host, which would split a compiled step into two graphs)."""
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), rows)
