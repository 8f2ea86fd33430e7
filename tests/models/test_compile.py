"""`torch.compile(fullgraph=True)` of the attention layer and of whole DNA LMs, forward and
backward, against eager mode: one graph, with the genoflash ops as its nodes.

aot_eager runs the traced graph with the same kernels, so it must equal eager mode bit for bit;
inductor fuses the torch ops around them, so it must agree to float32 rounding. On the CPU the
triton backend runs under the interpreter, and CI tests both backends; on a GPU the same tests run
the compiled kernels (tools/gpu_tests.sh)."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.layers import MultiHeadAttention
from genoflash.models import DNALM, DNALMConfig
from tests.utils import HAS_CUDA

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
BACKENDS = ["triton", "torch"]


class Recorder:
    """A torch.compile backend that keeps each graph Dynamo hands it, then runs aot_eager."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def ops(self) -> set[str]:
        """The genoflash ops called in the recorded graphs."""
        return {str(node.target).split(".")[1] for gm in self.graphs for node in gm.graph.nodes
                if node.op == "call_function" and str(node.target).startswith("genoflash.")}


def _run(module, inputs, seed=1):
    """(outputs, gradients of the inputs that need them and of every parameter)."""
    torch.manual_seed(seed)  # dropout's seed is drawn from torch's generator, in eager mode and in the graph
    out = module(*inputs)
    out = out["loss"] if isinstance(out, dict) else out
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad] + list(module.parameters())
    grads = torch.autograd.grad(out.float().square().sum(), wrt)
    return out.detach(), grads


def _assert_equal(expected, actual):
    (out0, grads0), (out1, grads1) = expected, actual
    assert torch.equal(out0, out1)
    assert len(grads0) == len(grads1) and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


ATTENTION = {
    "causal-rope-pass": dict(causal=True),
    "rope-fused-gqa": dict(nheads_k=2, rotary_fused=True),
    "window-softcap-dropout": dict(window_size=(6, 6), softcap=5.0, dropout=0.2),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(ATTENTION))
def test_multihead_attention_compiles_to_one_graph_equal_to_eager(case, backend):
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, **ATTENTION[case]).to(DEVICE)
    x = torch.randn(2, 37, 64, device=DEVICE, requires_grad=True)
    recorder = Recorder()
    torch._dynamo.reset()
    with genoflash.settings(backend=backend):
        expected = _run(layer, (x,))
        actual = _run(torch.compile(layer, fullgraph=True, backend=recorder), (x,))
    _assert_equal(expected, actual)
    assert len(recorder.graphs) == 1
    assert "flash_attn_forward" in recorder.ops()
    assert ("apply_rotary" in recorder.ops()) == (not ATTENTION[case].get("rotary_fused", False))


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_attention_compiles_and_checks_cu_seqlens_when_it_runs(backend):
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, causal=True).to(DEVICE)
    x = torch.randn(29, 32, device=DEVICE, requires_grad=True)
    cu = torch.tensor([0, 4, 5, 29], dtype=torch.int32, device=DEVICE)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    with genoflash.settings(backend=backend):
        _assert_equal(_run(layer, (x, cu, 24)), _run(compiled, (x, cu, 24)))
        # The lengths are values, which tracing never sees: the op checks them when it runs.
        with pytest.raises(ValueError, match="max_seqlen .* is smaller than the longest sequence"):
            compiled(x, cu, 20)


def test_settings_are_read_while_tracing_and_a_change_retraces():
    layer = MultiHeadAttention(32, 2, rotary=False).to(DEVICE)
    x = torch.randn(1, 9, 32, device=DEVICE)
    recorder = Recorder()
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=recorder)
    for backend in ("torch", "reference", "torch"):
        with genoflash.settings(backend=backend):
            expected = layer(x)
            torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
    backends = [node.args[-3] for gm in recorder.graphs for node in gm.graph.nodes
                if str(node.target).startswith("genoflash.flash_attn_forward")]
    assert len(recorder.graphs) == 2  # torch, then reference (torch ops, no genoflash op), then torch again: cached
    assert backends == ["torch"]


def _lm(pattern: str, **overrides) -> DNALM:
    # Under the interpreter every kernel program is a Python call: 8 channels (so 16 Mamba and 24
    # Hyena short-filter channels, one head of 8) give the same one graph as the GPU's 16 at half the
    # programs; the compiled multi-head and GQA layer is test_multihead_attention_compiles_... above.
    config = DNALMConfig(dim=16 if HAS_CUDA else 8, depth=len(pattern), nheads=2 if HAS_CUDA else 1,
                         layer_pattern=pattern, window_size=8, hyena_l_max=32, mamba_d_state=2, ffn_mult=2, **overrides)
    return DNALM(config).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_dna_lm_with_every_mixer_compiles_to_one_graph_equal_to_eager(backend, causal):
    """G and L (attention), H (Hyena: short and long convolutions) and M (Mamba, BiMamba when
    not causal): every op of the package inside one graph, forward and backward."""
    torch.manual_seed(0)
    model = _lm("GLHM", causal=causal, attn_dropout=0.1)
    tokens = torch.randint(0, 9, (2, 19), device=DEVICE)
    recorder = Recorder()
    torch._dynamo.reset()
    with genoflash.settings(backend=backend):
        expected = _run(model, (tokens, tokens))
        actual = _run(torch.compile(model, fullgraph=True, backend=recorder), (tokens, tokens))
    _assert_equal(expected, actual)
    assert len(recorder.graphs) == 1
    ops = {"flash_attn_forward"} | ({"short_conv", "fftconv", "selective_scan"} if backend == "triton" else set())
    assert ops <= recorder.ops()


def test_gradient_checkpointing_with_dropout_compiles_equal_to_eager():
    """Checkpointed blocks are recomputed in the backward; the recomputed dropout draws the same
    seed in the graph as in eager mode (the checkpoint restores the generator's state)."""
    torch.manual_seed(0)
    model = _lm("GH", attn_dropout=0.2, gradient_checkpointing=True)
    tokens = torch.randint(0, 9, (2, 19), device=DEVICE)
    torch._dynamo.reset()
    with genoflash.settings(backend="triton"):
        expected = _run(model, (tokens, tokens))
        actual = _run(torch.compile(model, fullgraph=True, backend="aot_eager"), (tokens, tokens))
    _assert_equal(expected, actual)


def test_dna_lm_compiled_inference_equals_eager():
    """eval mode without gradients: no chunk states kept (Mamba), filters not cached (Hyena)."""
    torch.manual_seed(0)
    model = _lm("GHM").eval()
    tokens = torch.randint(0, 9, (3, 17), device=DEVICE)
    torch._dynamo.reset()
    with torch.no_grad(), genoflash.settings(backend="triton"):
        expected = model(tokens)["logits"]
        actual = torch.compile(model, fullgraph=True, backend="aot_eager")(tokens)["logits"]
    assert torch.equal(expected, actual)


INDUCTOR = {
    "attention": lambda: MultiHeadAttention(32, 2, causal=True, dropout=0.1),
    # inductor's C++ build of a whole model takes minutes on 2 CPU cores: on the GPU only
    "dna-lm": pytest.param(lambda: _lm("GHM", attn_dropout=0.1),
                           marks=pytest.mark.skipif(not HAS_CUDA, reason="minutes of C++ builds on a CPU")),
}


@pytest.mark.parametrize("make", list(INDUCTOR.values()), ids=list(INDUCTOR))
def test_inductor_agrees_to_float32_rounding(make):
    """inductor fuses and reorders the float32 ops between the genoflash ops; dropout keeps
    eager mode's generator (fallback_random), so the same scores are dropped."""
    torch.manual_seed(0)
    module = make().to(DEVICE)
    is_lm = isinstance(module, DNALM)
    tokens = torch.randint(0, 9, (2, 19), device=DEVICE)
    inputs = (tokens, tokens) if is_lm else (torch.randn(2, 19, 32, device=DEVICE, requires_grad=True),)
    torch._dynamo.reset()
    with genoflash.settings(backend="triton"), torch._inductor.config.patch(fallback_random=True):
        (loss0, grads0) = _run(module, inputs)
        (loss1, grads1) = _run(torch.compile(module, fullgraph=True, backend="inductor"), inputs)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads0, grads1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6 * a.abs().max().item())
