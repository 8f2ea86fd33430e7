"""Mamba's selective scan (the Triton kernels: the sequential forward, the chunked backwards for
both layouts) against the sequential fp64 recurrence, the Mamba block and BiMamba."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import genoflash
from genoflash.layers import BiMamba, Mamba
from genoflash.ops.mamba import (backward_channels_first, chunk_states, forward, recurrence, selective_scan_fn,
                                  selective_scan_reference)
from genoflash.ops.mamba.recurrence import _softplus

from tests.utils import EPS
from tests.utils import HAS_CUDA

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])
pytestmark = pytest.mark.usefixtures("poison_allocations")


def scan_inputs(batch, seqlen, dim, dstate, dtype, device, features=True):
    """Fresh inputs with Mamba's ranges: delta > 0 small, A < 0."""
    def leaf(t):
        return t.to(dtype).requires_grad_()
    kw = {}
    if features:
        kw = dict(D=torch.randn(dim, device=device).requires_grad_(), z=leaf(torch.randn(batch, seqlen, dim,
                                                                                          device=device)),
                  delta_bias=(torch.rand(dim, device=device) - 2.0).requires_grad_(), delta_softplus=True)
    return dict(u=leaf(torch.randn(batch, seqlen, dim, device=device)),
                delta=leaf(torch.rand(batch, seqlen, dim, device=device) * (1.0 if features else 0.3)),
                A=(-torch.rand(dim, dstate, device=device) * 3 - 0.05).requires_grad_(),
                B=leaf(torch.randn(batch, seqlen, dstate, device=device)),
                C=leaf(torch.randn(batch, seqlen, dstate, device=device)), **kw)


def outputs_and_grads(fn, inputs, dy):
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    out = fn(**inputs)
    grads = torch.autograd.grad(out, list(tensors.values()), dy)
    return [out, *grads], ["out", *(f"d{k}" for k in tensors)]


def assert_scan_within_rule(inputs, dy, fn=selective_scan_fn):
    """genoflash's error vs fp64 <= 2 x the same-dtype sequential recurrence's + eps, for the
    output and the gradient of every tensor input. Returns genoflash's (outputs, names) it checked,
    so that a test comparing runs need not repeat this one (the interpreter is slow)."""
    with genoflash.use_backend("triton"):
        got, names = outputs_and_grads(fn, inputs, dy)
    same, _ = outputs_and_grads(selective_scan_reference, inputs, dy)
    as64 = {k: (v.detach().double().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    truth, _ = outputs_and_grads(selective_scan_reference, as64, dy.double())
    for name, g, s, t in zip(names, got, same, truth):
        assert g.shape == t.shape and g.dtype == s.dtype, name
        assert not torch.isnan(g).any(), f"{name}: NaN (an unwritten element)"
        err, err_same = (g.double() - t).abs().max().item(), (s.double() - t).abs().max().item()
        eps = EPS[g.dtype] * max(t.abs().max().item(), 1.0)
        assert err <= 2 * err_same + eps, f"{name}: error {err:.3e} > 2 x {err_same:.3e} + {eps:.1e}"
    return got, names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# The interpreter's tile is (16 steps, 8 channels, next_power_of_2(dstate) states), its forward
# steps one at a time and its scans run element by element: there the 129 steps take one partial
# channel block and a whole state block of 4 (as 16 is; dstate 16 is in the grid at seqlen 1,
# partial channel blocks after a whole one at seqlen 17, with a partial state block: 3 of 4 there,
# 5 of 8 on the GPU); the GPU keeps (12, 16).
@pytest.mark.parametrize("batch,seqlen,dim,dstate", [(1, 1, 8, 16), (2, 17, 10, 5 if HAS_CUDA else 3),
                                                     (1, 129, 12, 16) if HAS_CUDA else (1, 129, 6, 4),
                                                     (2, 40, 3, 1), (1, 33, 9, 2), (1, 50, 5, 3)])
def test_scan_matches_the_recurrence(batch, seqlen, dim, dstate, dtype, device):
    torch.manual_seed(seqlen + dim)
    inputs = scan_inputs(batch, seqlen, dim, dstate, dtype, device)
    assert_scan_within_rule(inputs, torch.randn(batch, seqlen, dim, device=device, dtype=dtype))


def _chunk_states_reference(inputs, chunk):
    """Each chunk's initial state and decay from the recurrence in float64: what the forward saves
    for the backward. (batch, n_chunks, dim, dstate) each."""
    u, delta, A, B = (inputs[k].detach().double() for k in ("u", "delta", "A", "B"))
    dt = delta + inputs["delta_bias"].detach().double()
    dt = torch.nn.functional.softplus(dt)
    batch, seqlen, dim = u.shape
    h = torch.zeros(batch, dim, A.shape[1], dtype=torch.float64, device=u.device)
    states, decays, log_decay = [], [], torch.zeros_like(h)
    for t in range(seqlen):
        if t % chunk == 0:
            if t:
                decays.append(log_decay.exp())
            states.append(h.clone())
            log_decay = torch.zeros_like(h)
        a = dt[:, t, :, None] * A[None]
        h = a.exp() * h + (dt[:, t] * u[:, t])[:, :, None] * B[:, t, None, :]
        log_decay += a
    decays.append(log_decay.exp())
    return torch.stack(states, 1), torch.stack(decays, 1)


@pytest.mark.parametrize("chunks_per_segment", [None, 3])
@pytest.mark.parametrize("layout", ["rows", "channels-first"])
def test_forward_chunk_states(chunks_per_segment, layout, device):
    """forward.py's chunk states (each chunk's initial state and decay, what the backward takes)
    against the recurrence in float64, with segments of one chunk (the interpreter's default) and of
    three (chunk boundaries inside a segment; the last segment partial, ending mid-tile). Its
    output is within the rule in the tests above. Without save_chunks it returns the same output,
    to float32 rounding (a separate build of the kernel, which may fuse the other product of the
    state update into an FMA: seen on the GPU; forward.py's _advance says why that is left to the
    compiler), and no states."""
    torch.manual_seed(23 + (chunks_per_segment or 1))
    interpreted = device.type != "cuda"
    # Interpreter: 12 channels are a whole and a partial channel block of 8, 3 states a partial
    # state block of 4 (the GPU's 20 and 5: its blocks are wider).
    batch, dim, dstate = (2, 20, 5) if not interpreted else (2, 12, 3)
    chunk = recurrence.chunk_blocks(dim, dstate, interpreted)["CHUNK"]
    # segments of three: 3 + 3 + 1 chunks on the GPU, 3 + 2 in the interpreter (whose forward steps
    # one at a time); the last chunk partial either way
    seqlen = (7 if not interpreted else 4) * chunk + 3
    inputs = {k: v.detach() if isinstance(v, torch.Tensor) else v
              for k, v in scan_inputs(batch, seqlen, dim, dstate, torch.float32, device).items()}
    if layout == "channels-first":
        for name in ("u", "delta", "z"):
            inputs[name] = _time_contiguous(inputs[name])
    kw = dict(D=inputs["D"], z=inputs["z"], delta_bias=inputs["delta_bias"], softplus=True,
              chunks_per_segment=chunks_per_segment)
    args = (inputs["u"], inputs["delta"], inputs["A"], inputs["B"], inputs["C"], interpreted)
    out, h, p = forward.scan_forward(*args, **kw)
    ref_h, ref_p = _chunk_states_reference(inputs, chunk)
    assert h.shape == ref_h.shape == p.shape == (batch, -(-seqlen // chunk), dim, dstate)
    assert out.stride() == inputs["u"].stride() if layout == "channels-first" else out.is_contiguous()
    torch.testing.assert_close(h.double(), ref_h, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p.double(), ref_p, rtol=1e-4, atol=1e-6)
    assert h[:, 1:].abs().amax() > 0.1 and (p < 0.99).any()  # states that carry something
    again, none_h, none_p = forward.scan_forward(*args, **kw, save_chunks=False)
    assert none_h is None and none_p is None
    torch.testing.assert_close(again, out, rtol=1e-5, atol=1e-6)


def atomic(**kwargs):
    return selective_scan_fn(**kwargs, deterministic=False)


def test_atomic_backward_is_within_the_rule(device):
    """deterministic=False: dB and dC summed by atomics over several channel blocks (3 in the
    interpreter, the last partial; 5 on the GPU), two chunks or more."""
    torch.manual_seed(11)
    dtype = torch.bfloat16 if HAS_CUDA else torch.float16
    dstate = 5 if HAS_CUDA else 3  # a partial state block either way (of 8 on the GPU, of 4 in the interpreter)
    inputs = scan_inputs(2, 21, 20, dstate, dtype, device)
    dy = torch.randn(2, 21, 20, device=device, dtype=dtype)
    fast, names = assert_scan_within_rule(inputs, dy, fn=atomic)
    with genoflash.use_backend("triton"):
        exact, _ = outputs_and_grads(selective_scan_fn, inputs, dy)
    for name, f, e in zip(names, fast, exact):  # the same sums in another order
        torch.testing.assert_close(f.float(), e.float(), rtol=2e-2, atol=2e-2, msg=name)


def test_deterministic_backward_repeats_bit_for_bit(device):
    torch.manual_seed(12)
    # 20 channels (3 channel blocks in the interpreter); 3 states there, a partial state block as 5 is on the GPU
    inputs = scan_inputs(1, 40, 20, 5 if HAS_CUDA else 3, torch.float32, device)
    dy = torch.randn(1, 40, 20, device=device)
    with genoflash.use_backend("triton"):
        first, names = outputs_and_grads(selective_scan_fn, inputs, dy)
        second, _ = outputs_and_grads(selective_scan_fn, inputs, dy)
    for name, a, b in zip(names, first, second):
        assert torch.equal(a, b), name


def test_scan_over_many_chunks_without_extras(device):
    """Hundreds of steps cross more chunk boundaries than the one-level carry walk takes (the
    state and the adjoint carried across two levels; on the GPU, where chunks are longer, thousands)."""
    torch.manual_seed(3)
    # 19 chunks of 16 in the interpreter, the last partial; there 4 states (the carry walk is the
    # same at any width, and the interpreter's scans cost in proportion to it), 16 on the GPU.
    n, dim, dstate = (8000, 64, 16) if HAS_CUDA else (289, 8, 4)
    assert n > chunk_states._ONE_LEVEL_CHUNKS * recurrence.chunk_blocks(dim, dstate, not HAS_CUDA)["CHUNK"]
    inputs = scan_inputs(1, n, dim, dstate, torch.float32, device, features=False)
    assert_scan_within_rule(inputs, torch.randn(1, n, dim, device=device))


def test_scan_rule_can_fail(device, monkeypatch):
    """The check rejects a scan that drops the state carried between chunks."""

    class NoCarry:  # stands in for the chunk-to-chunk pass: every chunk starts from zero
        def __getitem__(self, grid):
            def run(s_loc, decay, carried, *args, **kwargs):
                carried.zero_()
            return run

    monkeypatch.setattr(chunk_states, "_scan_chunk_pass_kernel", NoCarry())
    torch.manual_seed(4)
    # Several chunks (and at most _ONE_LEVEL_CHUNKS, so the one-level walk runs): the compiled
    # kernels' chunks are longer than the interpreter's.
    chunk = recurrence.chunk_blocks(8, 4, interpreted=device.type != "cuda")["CHUNK"]
    seqlen = 6 * chunk + 5
    assert seqlen // chunk <= chunk_states._ONE_LEVEL_CHUNKS
    inputs = scan_inputs(1, seqlen, 8, 4, torch.float32, device, features=False)
    with pytest.raises(AssertionError, match="out: error"):
        assert_scan_within_rule(inputs, torch.randn(1, seqlen, 8, device=device))


def test_scan_keeps_its_inputs_and_chunk_states_only(device):
    """For its backward the triton scan keeps the inputs as given (no float32 copies) and its
    chunk states, nothing of size (token, channel): the kernels recompute dt, the gate and the
    core's output. Keeping the core's float32 output (as before the prologue and epilogue moved
    into the kernels) or the float32 intermediates of a composition of PyTorch ops (~24 bytes
    per (token, channel)) fails here."""

    torch.manual_seed(13)
    # 4 chunks in the interpreter (10 on the GPU): the core's output still outweighs the states
    batch, seqlen, dim, dstate = 2, 150 if HAS_CUDA else 50, 12, 4
    inputs = scan_inputs(batch, seqlen, dim, dstate, torch.float16, device)
    input_storages = {t.untyped_storage().data_ptr() for t in inputs.values() if isinstance(t, torch.Tensor)}
    kept = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in input_storages:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with genoflash.use_backend("triton"), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = selective_scan_fn(**inputs)
    chunks = -(-seqlen // recurrence.chunk_blocks(dim, dstate, interpreted=device.type != "cuda")["CHUNK"])
    states = 2 * batch * chunks * dim * dstate * 4  # chunk-initial states and chunk decays
    a32 = dim * dstate * 4  # A as float32 (it is given as float32 here: then it is the input itself)
    core_output = batch * seqlen * dim * 4
    assert sum(kept.values()) <= states + a32 < states + core_output, kept
    assert sum(kept.values()) >= states  # the hook does see what the function keeps
    torch.autograd.grad(out, [inputs["u"]], torch.randn_like(out))  # the saved tensors still serve


@triton.jit
def _softplus_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Y + offs, _softplus(x), mask=offs < n)


def test_kernel_softplus_is_accurate_where_log1p_matters(device):
    """The kernels' softplus (recurrence._softplus) against float64, relative error, over x from -30
    to 30: Mamba's small steps (x ~ -7, dt ~ 1e-3) sit where log(1 + exp(x)) in fp32 is off by
    ~1e-4 relative, and exp(x) ~ 1e-13 where it rounds to 0. The bound allows for exp of a
    large argument: x log2(e) rounded to fp32 moves exp2's result by ~|x| 6e-8 relative."""
    x = torch.cat([torch.linspace(-30, 30, 1001), torch.tensor([-7.0, -6.9, -2.25, 0.0, 20.0, 20.5])]).to(device)
    y = torch.full_like(x, float("nan"))
    _softplus_kernel[(1,)](x, y, x.numel(), BLOCK=2048)
    truth = torch.nn.functional.softplus(x.double())
    rel = ((y.double() - truth).abs() / truth).max().item()
    assert rel < 4e-6, rel


@pytest.mark.parametrize("extra", ["D", "z", "z-view", "delta_bias", "softplus", "bias+softplus"])
def test_scan_with_each_prologue_and_epilogue_part_alone(extra, device):
    """The kernels branch on each of delta_bias, softplus, D and z (constexpr flags): each alone,
    over several chunks, within the rule. "z-view" passes z as a strided view, as the Mamba layer
    does (the second half of in_proj's output); D and delta_bias come as strided views too."""

    torch.manual_seed(16)
    dim, dstate = 6, 4
    batch = 2 if HAS_CUDA else 1  # the flags do not depend on the batch (every other test here takes 2)
    seqlen = 2 * recurrence.chunk_blocks(dim, dstate, interpreted=device.type != "cuda")["CHUNK"] + 3
    inputs = scan_inputs(batch, seqlen, dim, dstate, torch.float32, device, features=False)
    if extra == "D":
        inputs["D"] = torch.randn(2 * dim, device=device).requires_grad_()[::2]
    elif extra in ("z", "z-view"):
        z = torch.randn(batch, seqlen, 2 * dim, device=device).requires_grad_()
        inputs["z"] = z[..., dim:] if extra == "z-view" else z[..., dim:].detach().contiguous().requires_grad_()
    if "bias" in extra:
        # With the softplus: Mamba's initial range (dt from 1e-3 to 0.1, x = delta + bias down
        # to about -7, where log(1 + exp(x)) loses accuracy in fp32). Without: dt = delta + bias
        # must stay > 0.
        bias = torch.rand(2 * dim, device=device)
        bias = bias * 5.0 - 7.0 if "softplus" in extra else bias
        inputs["delta_bias"] = bias.requires_grad_()[1::2]
    if "softplus" in extra:
        inputs["delta_softplus"] = True
    assert_scan_within_rule(inputs, torch.randn(batch, seqlen, dim, device=device))


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_scan_backward_leaves_float32_inputs_untouched(with_bias, device):
    """The backward works in float32 and reuses its temporaries in place; with float32 inputs
    (where .float() returns the input itself) it must still not write into z or delta."""
    torch.manual_seed(14)
    inputs = scan_inputs(2, 33, 6, 4, torch.float32, device)
    if not with_bias:
        inputs["delta_bias"] = None
    before = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    dy = torch.randn(2, 33, 6, device=device)
    assert_scan_within_rule(inputs, dy)  # the triton forward and backward first, then the references
    for name, value in before.items():
        assert torch.equal(inputs[name].detach(), value), name


def test_flipped_reverse_scan_equals_the_reverse_scan(device, monkeypatch):
    """The backward's adjoint scan as a forward scan of the time-flipped tile (what the GPU
    always runs; the CPU runs take reverse=True, where tl.flip is slow, unless asked) gives the
    same gradients as Triton's reverse=True, and stays within the rule, over several chunks. On
    the GPU both runs are the flipped form."""

    torch.manual_seed(15)
    seqlen = 3 * recurrence.chunk_blocks(6, 4, interpreted=device.type != "cuda")["CHUNK"] + 7
    inputs = scan_inputs(1, seqlen, 6, 4, torch.float32, device)
    dy = torch.randn(1, seqlen, 6, device=device)
    fn = selective_scan_fn
    monkeypatch.setattr(recurrence, "FLIP_REVERSE_SCAN_IN_INTERPRETER", False)
    with genoflash.use_backend("triton"):
        reverse, names = outputs_and_grads(fn, inputs, dy)
    monkeypatch.setattr(recurrence, "FLIP_REVERSE_SCAN_IN_INTERPRETER", True)
    flipped, _ = assert_scan_within_rule(inputs, dy, fn=fn)  # the flipped form, within the rule
    for name, a, b in zip(names, reverse, flipped):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def _time_contiguous(t):
    """The same values as a (batch, seqlen, dim) view of (batch, dim, seqlen) memory."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(t.requires_grad)


@pytest.mark.parametrize("case", ["features", "features-flipped", "no-extras", "atomic", "odd-length-16-bit",
                                  "bias-z-only", "one-step"])
def test_channels_first_kernels_within_the_rule(case, device, monkeypatch):
    """The state-loop backward (backward_channels_first.py), which takes channels-first u and
    delta, within the rule over several chunks and channel blocks, and taken: a spy counts the
    calls. "odd-length" also checks a length where Triton cannot vectorise the loads; "flipped"
    runs the adjoint scans as forward scans over reversed steps (the GPU's form) on the CPU too,
    at an odd length."""
    calls = []
    real_forward = forward.scan_forward
    monkeypatch.setattr(forward, "scan_forward", lambda *a, **k: (calls.append("forward"), real_forward(*a, **k))[1])
    real_backward = backward_channels_first.scan_backward
    monkeypatch.setattr(backward_channels_first, "scan_backward",
                        lambda *a, **k: (calls.append("backward_channels_first"), real_backward(*a, **k))[1])
    if case.endswith("flipped"):
        monkeypatch.setattr(recurrence, "FLIP_REVERSE_SCAN_IN_INTERPRETER", True)
    torch.manual_seed(17)
    dtype = (torch.bfloat16 if HAS_CUDA else torch.float16) if case.startswith("odd") else torch.float32
    # Interpreter: 12 channels, a whole and a partial block of 8; the state loop runs dstate times
    # (3 there, whose steps are slow). The GPU: 20 channels (in one block of 64), 5 states.
    dim, dstate = (20, 5) if HAS_CUDA else (12, 3)
    chunk = recurrence.chunk_blocks(dim, dstate, interpreted=device.type != "cuda")["CHUNK"]
    # odd lengths end in a partial chunk (with "flipped": the zero padding of the reversed copy of C)
    seqlen = 1 if case == "one-step" else 3 * chunk + (5 if case.startswith("odd") or case.endswith("flipped") else 0)
    inputs = scan_inputs(2, seqlen, dim, dstate, dtype, device, features=case != "no-extras")
    if case.endswith("flipped"):  # B and C as a view of state-major float32 memory: taken without a copy
        inputs["B"], inputs["C"] = (_time_contiguous(inputs[name].float()) for name in ("B", "C"))
    for name in ("u", "delta", "z"):
        if name in inputs:
            inputs[name] = _time_contiguous(inputs[name])
    if case == "bias-z-only":
        inputs["D"] = None
        inputs["delta_softplus"] = False
        inputs["delta_bias"] = torch.rand(dim, device=device).requires_grad_()
    fn = atomic if case == "atomic" else selective_scan_fn
    assert_scan_within_rule(inputs, torch.randn(2, seqlen, dim, device=device, dtype=dtype), fn=fn)
    assert calls == ["forward", "backward_channels_first"]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(u=torch.zeros(2, 3)), ValueError, "u must be"),
    (dict(delta=torch.zeros(1, 4, 8)), ValueError, "delta must have"),
    (dict(A=torch.zeros(7, 4)), ValueError, "A must be"),
    (dict(A=torch.zeros(8, 65), B=torch.zeros(1, 5, 65), C=torch.zeros(1, 5, 65)), ValueError, "dstate"),
    (dict(B=torch.zeros(1, 5, 3)), ValueError, "B must be"),
    (dict(z=torch.zeros(1, 5, 7)), ValueError, "z must have"),
    (dict(D=torch.zeros(3)), ValueError, "D must be"),
    (dict(u=[1.0]), TypeError, "torch.Tensor"),
])
def test_bad_scan_input(kwargs, error, match):
    base = dict(u=torch.zeros(1, 5, 8), delta=torch.zeros(1, 5, 8), A=-torch.ones(8, 4), B=torch.zeros(1, 5, 4),
                C=torch.zeros(1, 5, 4))
    with pytest.raises(error, match=match):
        selective_scan_fn(**{**base, **kwargs})


def test_mamba_block_is_causal_and_bimamba_is_not(device):
    torch.manual_seed(6)
    x = torch.randn(2, 33, 16, device=device, dtype=torch.float64)
    changed = x.clone()
    changed[:, 25] += 1.0
    with genoflash.use_backend("torch"), torch.no_grad():
        causal = Mamba(16, d_state=8).to(device, torch.float64)
        both = BiMamba(16, d_state=8).to(device, torch.float64)
        assert (causal(changed)[:, :25] - causal(x)[:, :25]).abs().max() == 0
        assert (both(changed)[:, :25] - both(x)[:, :25]).abs().max() > 1e-6


def test_mamba_block_triton_matches_torch_backend(device):
    """The block through the triton scan against the torch backend's recurrence: the block makes
    (batch, dim, seqlen) activations and the scan takes its state-loop backward."""
    torch.manual_seed(7)
    block = Mamba(12, d_state=5 if HAS_CUDA else 3).to(device)  # a partial state block either way
    x = torch.randn(2, 45, 12, device=device, requires_grad=True)
    outs = []
    for backend in ("triton", "torch"):
        with genoflash.use_backend(backend):
            y = block(x)
            grads = torch.autograd.grad(y.square().sum(), [x, *block.parameters()])
        outs.append([y, *grads])
    for a, b in zip(*outs):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch, seqlen", [(1, 37), (2, 33)])
def test_mamba_block_channels_first_is_the_channels_last_block(batch, seqlen, device):
    """The block on (batch, dim, seqlen) activations (projections across the layout in the
    matmuls, the conv and SiLU fused, the state-loop scan kernels) computes the block of
    nn.Linear / nn.Conv1d on (batch, seqlen, dim) activations (Mamba.forward_reference): the
    triton backend in float32 against the torch backend's reference block in float64, output and
    every gradient."""
    torch.manual_seed(8)
    # In the interpreter 16 inner channels (2 blocks of 8) and dt_rank 2, as the GPU's Mamba(32) has
    ref_block = (Mamba(32, d_state=4) if HAS_CUDA else Mamba(16, d_state=4, dt_rank=2, expand=1))
    ref_block = ref_block.to(device, torch.float64)
    x = torch.randn(batch, seqlen, ref_block.d_model, device=device, dtype=torch.float64, requires_grad=True)
    with genoflash.use_backend("torch"):
        ref = ref_block.forward_reference(x)
        ref_grads = torch.autograd.grad(ref.square().sum(), [x, *ref_block.parameters()])
    block = copy.deepcopy(ref_block).float()
    x32 = x.detach().float().requires_grad_()
    with genoflash.use_backend("triton"):
        y = block(x32)
        grads = torch.autograd.grad(y.square().sum(), [x32, *block.parameters()])
    names = ["y", "x", *(n for n, _ in block.named_parameters())]
    for name, a, b in zip(names, [y, *grads], [ref, *ref_grads]):
        assert (a.double() - b).abs().max() <= 1e-5 * b.abs().max(), name


def _published_mamba_block(m, u):
    """Mamba-1's block (Gu & Dao 2023; mamba-ssm's Mamba with selective_scan_ref) on m's
    parameters, from the equations, one step at a time and no genoflash op: x, z = in_proj(u);
    x = silu(causal depthwise conv1d(x)), tap j at position t reading x[t - (d_conv - 1) + j];
    dt, B, C = x_proj(x); dt = softplus(dt_proj(dt)); h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t with
    A = -exp(A_log); y_t = C_t . h_t + D x_t; out_proj(y * silu(z)). A, D and the dt bias are
    rounded to float32 as the block (and mamba-ssm) rounds them, so that float64 agrees to rounding."""
    batch, seqlen, _ = u.shape
    x, z = F.linear(u, m.in_proj.weight, m.in_proj.bias).split(m.d_inner, dim=-1)
    w = m.conv1d.weight[:, 0]
    conv = []
    for t in range(seqlen):
        acc = m.conv1d.bias.expand(batch, -1)
        for j in range(m.d_conv):
            if t - (m.d_conv - 1) + j >= 0:
                acc = acc + w[:, j] * x[:, t - (m.d_conv - 1) + j]
        conv.append(acc)
    x = F.silu(torch.stack(conv, 1))
    dt, B, C = F.linear(x, m.x_proj.weight).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
    dt = F.softplus(F.linear(dt, m.dt_proj.weight) + m.dt_proj.bias.float().to(u.dtype))
    A, D = -torch.exp(m.A_log.float()).to(u.dtype), m.D.float().to(u.dtype)
    h = u.new_zeros(batch, m.d_inner, m.d_state)
    ys = []
    for t in range(seqlen):
        h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
        ys.append((h * C[:, t, None, :]).sum(-1) + D * x[:, t])
    return F.linear(torch.stack(ys, 1) * F.silu(z), m.out_proj.weight, m.out_proj.bias)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["Mamba", "BiMamba"])
def test_mamba_block_is_the_published_block_in_float64(bidirectional, device):
    """The block (forward and forward_reference, torch backend) and BiMamba (forward Mamba plus the
    backward Mamba on the time-flipped input, flipped back) against the published Mamba-1
    equations written step by step, in float64 at odd sizes: the output and the gradient of the
    input and of every parameter, to float64 rounding. Every parameter is moved off its
    initial value (D = 1, zero biases) so that no term of the equations drops out."""
    torch.manual_seed(9)
    block = (BiMamba if bidirectional else Mamba)(24, d_state=16).to(device, torch.float64)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    u = torch.randn(2, 17, 24, device=device, dtype=torch.float64)
    dy = torch.randn_like(u)
    params = list(block.parameters())

    def published(v):
        if not bidirectional:
            return _published_mamba_block(block, v)
        return (_published_mamba_block(block.forward_mamba, v)
                + _published_mamba_block(block.backward_mamba, v.flip(1)).flip(1))

    def out_and_grads(fn):
        v = u.clone().requires_grad_()
        y = fn(v)
        return [y, *torch.autograd.grad(y, [v, *params], dy)]

    truth = out_and_grads(published)
    runs = {"forward": block} if bidirectional else {"forward": block, "forward_reference": block.forward_reference}
    names = ["out", "du", *(f"d{n}" for n, _ in block.named_parameters())]
    with genoflash.use_backend("torch"):
        for run, fn in runs.items():
            for name, got, want in zip(names, out_and_grads(fn), truth):
                err = (got - want).abs().max().item()
                assert err <= 1e-12 * max(want.abs().max().item(), 1.0), f"{run} {name}: error {err:.3e}"

def test_bad_mamba_config():
    with pytest.raises(ValueError, match="d_state"):
        Mamba(16, d_state=0)
    with pytest.raises(ValueError, match=r"expected input \(batch, seqlen, 16\)"):
        Mamba(16)(torch.zeros(2, 3, 8))
