"""Changes to the raw scores s = q.k before the softmax: softcap and ALiBi.

Scores stay in raw units throughout (the softmax scale is folded into exp2 later, see
softmax.py), so each modification is expressed in raw units too:
    softcap:  scale*s -> c*tanh(scale*s/c)   ==  s -> (c/scale) * tanh(s * (scale/c))
    ALiBi:    scale*s -> scale*s - slope*|i + shift - j|  ==  s -> s - (slope/scale)*|i + shift - j|
"""

import triton
import triton.language as tl


@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if FAST:
        # One MUFU instruction (sm_75+), max relative error ~2^-11: below bf16/fp16 rounding
        # of the scores it feeds. Not available under the interpreter.
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exact to fp32 rounding, saturates cleanly at +-1.
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _softcap(s, softcap_in, softcap_out, FAST: tl.constexpr):
    """Returns (capped scores, tanh values); tanh is kept for the gradient 1 - tanh^2.

    softcap_in = scale / c and softcap_out = c / scale (host-computed)."""
    t = _tanh(s * softcap_in, FAST)
    return t * softcap_out, t


@triton.jit
def _alibi_bias(rows, cols, seqlen_q, seqlen_k, slope_raw):
    """-(slope/scale) * |i + shift - j| for broadcast row/column indices."""
    return -slope_raw * tl.abs(rows + (seqlen_k - seqlen_q) - cols).to(tl.float32)
