"""`genoflash train` over gloo ranks on the CPU: data parallelism (DDP and FSDP2), data x context
parallelism, and a killed torchrun job resumed, each against one process on the same global batch.

The invariant under test (genoflash/train/parallel.py): however the global batch is split over
ranks, micro-batches and sequence shards, the run trains the same model as one process, to float32
rounding (the sums run in another order), and logs the same losses.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FASTA = "yersinia-plasmid"  # a genome shipped with genoflash (genoflash/data/examples)
LM = dict(task="lm", fasta=FASTA, dim=32, depth=2, nheads=2, seq_len=48, steps=3, eval_samples=3, eval_every=0,
          log_every=1, warmup_steps=1, progress=False, layer_pattern="G", device="cpu")  # gloo ranks: CPU tensors
SYNTHETIC = dict(task="synthetic", dim=16, depth=2, nheads=2, seq_len=192, distance=24, window_size=8, steps=3,
                 eval_samples=5, eval_every=0, log_every=1, warmup_steps=1, progress=False, device="cpu")


def _full_state(model) -> dict[str, torch.Tensor]:
    """Every weight whole on every rank (FSDP2's are sharded DTensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    if dist.is_initialized():
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return model.state_dict()


def _worker(rank, world, init_file, out_dir, settings):
    from genoflash.train import TrainConfig, train

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        result = train(TrainConfig(**settings, out_dir=out_dir))
        state = {name: t.detach().clone() for name, t in _full_state(result["model"]).items()}
        if rank == 0:
            torch.save(state, os.path.join(out_dir, "weights.pt"))  # test output, read back by the test only
            with open(os.path.join(out_dir, "history.json"), "w") as f:
                json.dump(result["history"], f)
        # Every rank ends with the same weights.
        flat = torch.cat([t.flatten() for t in state.values()])
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        assert all(torch.equal(everyone[0], f) for f in everyone)
        dist.barrier()  # leave together: a rank tearing gloo down mid-collective can abort its peer
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path, world, name, settings) -> tuple[list[dict], dict]:
    out = tmp_path / name
    mp.spawn(_worker, args=(world, str(tmp_path / f"{name}.rendezvous"), str(out), settings), nprocs=world, join=True)
    return json.loads((out / "history.json").read_text()), torch.load(out / "weights.pt", weights_only=True)


def _assert_same_training(single: dict, history: list[dict], weights: dict) -> None:
    losses = [h["loss"] for h in single["history"] if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
    assert [h["loss"] for h in history if "loss" in h] == pytest.approx(losses, rel=1e-4)
    evals = [h["eval"] for h in single["history"] if "eval" in h]
    got = [h["eval"] for h in history if "eval" in h]
    assert len(evals) == len(got) >= 1
    for a, b in zip(evals, got):
        assert b == pytest.approx(a, rel=1e-4)
    for name, weight in single["model"].state_dict().items():
        torch.testing.assert_close(weights[name], weight, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("mode, task", [("ddp", "lm"), ("fsdp", "lm"), ("ddp", "synthetic")])
def test_data_parallel_equals_one_process(tmp_path, mode, task):
    """Two data-parallel ranks reading micro-batches of 1 (two per step) train the model one process
    trains with micro-batches of 2; the held-out set is split between them and its metrics (the
    synthetic task's AUROC over gathered scores) come out the same."""
    from genoflash.train import TrainConfig, train

    base = LM if task == "lm" else SYNTHETIC
    single = train(TrainConfig(**base, batch_size=2, grad_accum=2, out_dir=str(tmp_path / "single")))
    history, weights = _run_ranks(tmp_path, 2, mode, dict(base, batch_size=1, grad_accum=2, data_parallel=mode))
    _assert_same_training(single, history, weights)
    run = history[0]["run"]
    assert (run["ranks"], run["data_parallel"], run["sequences_per_step"]) == (2, 2, 4)
    assert all("tokens_per_s_per_rank" in h for h in history if "loss" in h)


def test_data_and_context_parallel_equal_one_process(tmp_path):
    """Four ranks as data parallel 2 x context parallel 2: each pair shares a sequence (ring
    attention), the pairs read different ones."""
    from genoflash.train import TrainConfig, train

    single = train(TrainConfig(**LM, batch_size=2, out_dir=str(tmp_path / "single")))
    history, weights = _run_ranks(tmp_path, 4, "dp2xcp2", dict(LM, batch_size=1, context_parallel=2))
    _assert_same_training(single, history, weights)
    assert history[0]["run"]["layout"].startswith("4 ranks = data parallel 2 (ddp) x context parallel 2")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_context_parallel_training_equals_one_process(tmp_path, mode):
    """Two ranks holding half of every sequence each, accumulating two micro-batches of 1."""
    from genoflash.train import TrainConfig, train

    single = train(TrainConfig(**LM, batch_size=1, grad_accum=2, out_dir=str(tmp_path / "single")))
    history, weights = _run_ranks(tmp_path, 2, "cp", dict(LM, batch_size=1, grad_accum=2, context_parallel=2,
                                                          data_parallel=mode))
    _assert_same_training(single, history, weights)
    assert (tmp_path / "cp" / "checkpoints").is_dir() and (tmp_path / "cp" / "log.jsonl").exists()


def test_context_parallel_needs_a_job():
    from genoflash.train import TrainConfig, train

    with pytest.raises(ValueError, match="run under torchrun"):
        train(TrainConfig(**LM, context_parallel=2, batch_size=1, out_dir="unused"))


# ---------------------------------------------------------------- a torchrun job, killed and resumed

KILLED = ["--task", "lm", "--fasta", FASTA, "--dim", "32", "--depth", "2", "--nheads", "2", "--seq-len", "128",
          "--batch-size", "2", "--steps", "12", "--checkpoint-every", "2", "--eval-every", "0",
          "--eval-samples", "4", "--log-every", "1", "--device", "cpu", "--no-progress", "--data-parallel"]


def _torchrun(out_dir, mode, *extra) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "genoflash.cli", "train", *KILLED, mode, "--out-dir", str(out_dir), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: killed whole below


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_killed_torchrun_job_resumes_exactly(tmp_path, mode):
    """SIGKILL to every process of a two-rank job once it has written a checkpoint; `--resume`
    then ends with the weights and the log of the job that was never killed, bit for bit."""
    from genoflash.train import load_trained_model
    from genoflash.train.checkpoint import checkpoint_dirs

    straight = _torchrun(tmp_path / "straight", mode)
    output = straight.communicate(timeout=600)[0]
    assert straight.returncode == 0, output

    run = tmp_path / "killed"
    job = _torchrun(run, mode)
    deadline = time.monotonic() + 600
    while not checkpoint_dirs(run) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    written = [d.name for d in checkpoint_dirs(run)]
    assert written and "step-00000012" not in written, f"the job was not killed mid-run: {written}"

    resumed = _torchrun(run, mode, "--resume")
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    a, b = load_trained_model(tmp_path / "straight"), load_trained_model(run)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in logged if "loss" in h] == list(range(1, 13))  # no gap, no repeat
    straight_log = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    assert [h["loss"] for h in logged if "loss" in h] == [h["loss"] for h in straight_log if "loss" in h]
    shutil.rmtree(tmp_path)  # the two runs' checkpoints
