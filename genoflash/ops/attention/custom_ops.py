"""Attention as `torch.library` custom ops, for `torch.compile`: `genoflash::flash_attn_forward`
and `genoflash::flash_attn_backward`, with fake (meta) implementations and an autograd formula.

Dynamo cannot trace the kernels' launch code (launch plans, descriptors, triton's launcher), and
should not unroll the torch backend's loops over tiles. Under `torch.compile` the public functions
therefore validate as in eager mode, choose the backend while tracing (a guarded constant), and
call these ops, which the graph keeps as single nodes. Eager calls keep the autograd.Function of
interface.py and never pass through here; both run passes.py. docs/design/custom-ops.md says why.

An op takes only tensors and plain values, so AttentionArgs travels as its fields and is rebuilt
inside. What reads tensor values (cu_seqlens' lengths, the dropout seed) is done inside the op,
on real tensors: while tracing, values do not exist.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...settings import Settings
from ..common.checks import check_cu_seqlens
from .args import AttentionArgs
from .dropout import DropoutArgs
from .passes import backward_pass, forward_pass
from .validation import check_rotary_lengths, last_dim_contiguous


def _args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
          softcap, alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_p, dropout_rng, deterministic,
          backend, tma, fast_launch, check: bool) -> AttentionArgs:
    """The op's arguments -> AttentionArgs; with check, the value checks the trace could not make."""
    dropout = None
    if dropout_p > 0.0:
        seed, offset = dropout_rng.tolist()
        dropout = DropoutArgs(dropout_p, seed, offset & 0x7FFFFFFF)  # as draw_seed_and_offset
    if check and cu_seqlens_q is not None:
        lengths_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device)
        lengths_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device)
        if len(lengths_q) != len(lengths_k):
            raise ValueError(f"cu_seqlens_q describes {len(lengths_q)} sequences but cu_seqlens_k {len(lengths_k)}")
        if rotary_cos is not None:
            check_rotary_lengths(rotary_cos, lengths_q, lengths_k)
    return AttentionArgs(softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
                         softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
                         dropout=dropout, deterministic=deterministic,
                         settings=Settings(backend=backend, tma=tma, fast_launch=fast_launch))


def _lse_shape(q: torch.Tensor, varlen: bool) -> tuple[int, ...]:
    # (batch, nheads, seqlen_q), or (nheads, total_q) for a packed batch
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("genoflash::flash_attn_forward", mutates_args=())
def flash_attn_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
    softmax_scale: float, window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
    rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor], rotary_interleaved: bool,
    dropout_p: float, dropout_rng: Optional[torch.Tensor], deterministic: bool,
    backend: str, tma: bool, fast_launch: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of passes.forward_pass on the given backend."""
    a = _args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
              softcap, alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_p, dropout_rng,
              deterministic, backend, tma, fast_launch, check=True)
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    out, lse = forward_pass(q, k, v, a, backend)
    # The fake below promises contiguous outputs, and the graph's later nodes rely on it.
    return out.contiguous(), lse.contiguous()


@flash_attn_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, *rest):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("genoflash::flash_attn_backward", mutates_args=())
def flash_attn_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
    softmax_scale: float, window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
    rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor], rotary_interleaved: bool,
    dropout_p: float, dropout_rng: Optional[torch.Tensor], deterministic: bool,
    backend: str, tma: bool, fast_launch: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of passes.backward_pass: the forward's arguments, so the same dropout bits."""
    a = _args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
              softcap, alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_p, dropout_rng,
              deterministic, backend, tma, fast_launch, check=False)  # checked by the forward
    dout, q, k, v = (last_dim_contiguous(t) for t in (dout, q, k, v))
    dq, dk, dv = backward_pass(dout, q, k, v, out, lse, a, backend)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@flash_attn_backward.register_fake
def _(dout, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_TENSOR_INPUTS = 3  # q, k, v: the only differentiable inputs


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:_TENSOR_INPUTS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.rest = inputs[_TENSOR_INPUTS:]  # the op's other arguments, tensors among them (kept alive here)
    ctx.mark_non_differentiable(lse)


def _backward_formula(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attn_backward(dout, q, k, v, out, lse, *ctx.rest)
    return (dq, dk, dv) + (None,) * len(ctx.rest)


flash_attn_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def op_arguments(a: AttentionArgs, backend: str) -> tuple:
    """The arguments of both ops after their tensors, from AttentionArgs and the backend."""
    dropout_p, dropout_rng = 0.0, None
    if a.dropout is not None:
        dropout_p = a.dropout.p
        if a.dropout.seed is None:  # drawn in the graph, as draw_seed_and_offset draws it in eager mode
            dropout_rng = torch.randint(0, 2**62, (2,), dtype=torch.int64)
        else:
            dropout_rng = torch.tensor([a.dropout.seed, a.dropout.offset], dtype=torch.int64)
    s = a.settings
    return (a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k, a.softmax_scale, a.window_left,
            a.window_right, a.softcap, a.alibi_slopes, a.rotary_cos, a.rotary_sin, a.rotary_interleaved, dropout_p,
            dropout_rng, a.deterministic, backend, s.tma, s.fast_launch)


def flash_attn(q, k, v, a: AttentionArgs, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) through the custom op: what interface.py calls while Dynamo traces."""
    return flash_attn_forward(q, k, v, *op_arguments(a, backend))
