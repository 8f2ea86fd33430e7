"""Context parallelism: ring attention over gloo ranks on the CPU equals single-process attention.

Each spawned rank draws the same full inputs (same seed), runs ring attention on its shard,
and checks its shard of the output and of every gradient against the same shard of the
fp64 / same-dtype references under the rule (tests/utils.py). A failure on any rank fails
the test with that rank's traceback.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import genoflash
from genoflash.distributed import ring_flash_attn_func, shard_positions, shard_sequence, unshard_sequence
from genoflash.ops.attention.reference import attention_reference
from genoflash.ops.rotary import rotary_tables, rotate

from tests.utils import assert_within_rule, outputs_and_grads, reference_pair

# (name, backend, dtype, batch, seqlen, nheads, nheads_k, d, dv, features)
CASES = {
    2: [
        ("full", "torch", torch.float32, 2, 2 * 13, 3, 3, 16, 16, {}),              # odd local length
        ("causal-zigzag", "torch", torch.float32, 1, 4 * 7, 4, 2, 16, 24, dict(causal=True)),
        ("causal-contiguous", "torch", torch.float32, 1, 2 * 9, 2, 1, 16, 16,
         dict(causal=True, layout="contiguous")),
        ("rope-gqa-causal", "torch", torch.float32, 1, 4 * 6, 4, 2, 32, 32, dict(causal=True, rope=True)),
        ("softcap", "torch", torch.float32, 1, 2 * 10, 2, 2, 16, 16, dict(softcap=5.0)),
        ("triton-causal", "triton", torch.float16, 1, 4 * 9, 2, 1, 16, 16, dict(causal=True)),
        ("triton-full", "triton", torch.float16, 1, 2 * 17, 3, 1, 24, 16, {}),
    ],
    4: [
        ("full", "torch", torch.float32, 1, 4 * 5, 2, 2, 16, 16, {}),
        ("causal-zigzag", "torch", torch.float32, 2, 8 * 3, 3, 3, 16, 16, dict(causal=True)),
        ("rope-causal", "torch", torch.float32, 1, 8 * 4, 2, 1, 16, 16, dict(causal=True, rope=True)),
        ("triton-causal", "triton", torch.float16, 1, 8 * 5, 2, 2, 16, 16, dict(causal=True)),
    ],
}


def _check_case(rank, world, group, case):
    name, backend, dtype, batch, seqlen, nheads, nheads_k, d, dv, features = case
    features = dict(features)
    if backend == "triton" and torch.cuda.is_available():
        # gloo moves CPU tensors; compiled Triton needs CUDA ones. On a GPU machine the kernels'
        # ring path is covered by the NCCL test below, and these cases run the torch backend.
        backend = "torch"
    rope = features.pop("rope", False)
    causal = features.get("causal", False)
    layout = features.pop("layout", "zigzag" if causal else "contiguous")
    torch.manual_seed(1000 + seqlen)  # identical full inputs on every rank
    q = torch.randn(batch, seqlen, nheads, d, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen, nheads_k, d, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen, nheads_k, dv, dtype=dtype, requires_grad=True)
    dout = torch.randn(batch, seqlen, nheads, dv, dtype=dtype)
    cos, sin = rotary_tables(seqlen, d, dtype=torch.float32) if rope else (None, None)

    def standard(a, b, c):
        if rope:
            a, b = rotate(a, cos, sin), rotate(b, cos, sin)
        group_size = a.shape[2] // b.shape[2]
        b, c = b.repeat_interleave(group_size, 2), c.repeat_interleave(group_size, 2)
        return attention_reference(a, b, c, causal=causal, softcap=features.get("softcap", 0.0))[0]

    truth, same = reference_pair(q, k, v, dout, fn=standard)

    def shard(t):
        return shard_sequence(t.detach(), world, rank, layout)

    q_s, k_s, v_s = (shard(t).requires_grad_() for t in (q, k, v))
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: ring_flash_attn_func(
            a, b, c, group=group, layout=layout, rotary_cos=cos, rotary_sin=sin, **features), q_s, k_s, v_s,
            shard(dout))
    try:
        assert_within_rule(got, [shard(t) for t in truth], [shard(t) for t in same])
    except AssertionError as e:
        raise AssertionError(f"case {name}, rank {rank} of {world}: {e}") from None


def _worker(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        for case in CASES[world]:
            _check_case(rank, world, None, case)
        if world == 2:
            # A group other than the world, of one rank: the ring degenerates to one local block.
            singletons = [dist.new_group([r]) for r in range(world)]
            _check_case(0, 1, singletons[rank], ("single-rank group", "torch", torch.float32, 1, 10, 2, 2, 16, 16,
                                                 dict(causal=True)))
            # Shards of different shapes on different ranks are an error on every rank.
            q = torch.randn(1, 8 + 2 * rank, 2, 16)
            with pytest.raises(ValueError, match="differ across ranks"):
                ring_flash_attn_func(q, q, q)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_single_process_attention(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "rendezvous")), nprocs=world, join=True)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_shard_and_unshard_are_inverse(layout):
    x = torch.arange(2 * 24 * 3).reshape(2, 24, 3)
    shards = [shard_sequence(x, 3, r, layout) for r in range(3)]
    assert torch.equal(unshard_sequence(shards, layout), x)
    # Every token is held exactly once, at the positions shard_positions names.
    held = sorted(p for r in range(3) for s, e in shard_positions(24, 3, r, layout) for p in range(s, e))
    assert held == list(range(24))
    for r in range(3):
        positions = [p for s, e in shard_positions(24, 3, r, layout) for p in range(s, e)]
        assert torch.equal(shards[r], x[:, positions])


def test_zigzag_pairs_an_early_chunk_with_a_late_one():
    assert shard_positions(16, 4, 0, "zigzag") == [(0, 2), (14, 16)]
    assert shard_positions(16, 4, 3, "zigzag") == [(6, 8), (8, 10)]


def test_sharding_errors():
    with pytest.raises(ValueError, match="does not split into 8 equal chunks"):
        shard_sequence(torch.zeros(1, 20, 2), 4, 0, "zigzag")
    with pytest.raises(ValueError, match="does not split into 3 equal chunks"):
        shard_positions(10, 3, 0, "contiguous")
    with pytest.raises(ValueError, match="layout"):
        shard_positions(12, 3, 0, "striped")
    with pytest.raises(ValueError, match="rank 3 is not in a group of 3"):
        shard_positions(12, 3, 3)


def test_ring_attention_needs_a_process_group():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_flash_attn_func(q, q, q)


def _nccl_worker(rank, init_file):
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=1)
    try:
        torch.manual_seed(7)
        q, k, v = (torch.randn(1, 1000, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        cos, sin = rotary_tables(1000, 128, device="cuda")
        for causal in (False, True):
            ring = outputs_and_grads(lambda a, b, c: ring_flash_attn_func(a, b, c, causal=causal, rotary_cos=cos,
                                                                          rotary_sin=sin), q, k, v, dout)
            # The same rotation as the ring's (genoflash's rotary pass), so that the two agree bit for bit.
            single = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
                genoflash.apply_rotary_emb(a, cos, sin), genoflash.apply_rotary_emb(b, cos, sin), c, causal=causal,
                deterministic=True),
                q, k, v, dout)
            for name, x, y in zip(("out", "dq", "dk", "dv"), ring, single):
                assert torch.equal(x, y), f"{name} (causal={causal}) differs from single-device attention"
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_rank_nccl_ring_runs_the_gpu_path(tmp_path):
    """NCCL cannot put two ranks on one GPU; one rank still runs the GPU code path end to end
    (NCCL all_gather of the shape check, the fused kernels, the LSE merge, the block backward)."""
    mp.spawn(_nccl_worker, args=(str(tmp_path / "rendezvous"),), nprocs=1, join=True)


def _two_gpu_worker(rank, init_file):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # (dtype, seqlen, nheads, nheads_k, d, causal, rope): odd per-rank lengths, GQA, Dv = D.
        for dtype, seqlen, nheads, nheads_k, d, causal, rope in (
                (torch.bfloat16, 2 * 1001, 4, 2, 128, False, False),
                (torch.bfloat16, 4 * 501, 4, 4, 128, True, True),
                (torch.float16, 4 * 257, 3, 1, 96, True, False)):
            torch.manual_seed(seqlen)  # identical full inputs on both ranks
            q, k, v = (torch.randn(1, seqlen, h, d, device="cuda", dtype=dtype, requires_grad=True)
                       for h in (nheads, nheads_k, nheads_k))
            dout = torch.randn(1, seqlen, nheads, d, device="cuda", dtype=dtype)
            cos, sin = rotary_tables(seqlen, d, device="cuda") if rope else (None, None)
            layout = "zigzag" if causal else "contiguous"

            def standard(a, b, c):
                if rope:
                    a, b = rotate(a, cos, sin), rotate(b, cos, sin)
                b, c = (t.repeat_interleave(nheads // nheads_k, 2) for t in (b, c))
                return attention_reference(a, b, c, causal=causal)[0]

            truth, same = reference_pair(q, k, v, dout, fn=standard)

            def shard(t):
                return shard_sequence(t.detach(), 2, rank, layout)

            got = outputs_and_grads(lambda a, b, c: ring_flash_attn_func(
                a, b, c, causal=causal, layout=layout, rotary_cos=cos, rotary_sin=sin),
                *(shard(t).requires_grad_() for t in (q, k, v)), shard(dout))
            try:
                assert_within_rule(got, [shard(t) for t in truth], [shard(t) for t in same])
            except AssertionError as e:
                raise AssertionError(f"{dtype} N={seqlen} causal={causal} rope={rope}, rank {rank}: {e}") from None
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpu_nccl_ring_equals_single_device_attention(tmp_path):
    """Two NCCL ranks on two GPUs: K/V shards and their gradients cross the link between them."""
    mp.spawn(_two_gpu_worker, args=(str(tmp_path / "rendezvous"),), nprocs=2, join=True)
