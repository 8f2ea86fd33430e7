"""genoflash.train: learning, exact resume, checkpoints, guards, AUROC, the demo, bad records (the
settings and the command line: test_config.py)."""

import json
import math
import logging

import pytest
import torch

from genoflash.data import SyntheticLongRangeDataset
from genoflash.train import TrainConfig, auroc, train
from genoflash.train import demo
from genoflash.train.config import build_parser, config_from_args

TINY = dict(task="synthetic", dim=16, depth=2, nheads=2, seq_len=192, distance=24, window_size=8,
            batch_size=8, eval_samples=16, progress=False, log_every=1, eval_every=0)


def test_loss_decreases(tmp_path):
    # A fixed small training set (the stream cycles over it): the loss must fall.
    data = SyntheticLongRangeDataset(16, 192, 24, seed=0)
    history = train(TrainConfig(**TINY, steps=30, lr=3e-3, warmup_steps=2, out_dir=str(tmp_path)),
                    train_data=data, eval_data=data)["history"]
    losses = [h["loss"] for h in history if "loss" in h and "eval" not in h]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.05


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_resume_is_bitwise_exact(tmp_path, grad_accum):
    cfg = dict(TINY, steps=8, checkpoint_every=100, batch_size=8 // grad_accum, grad_accum=grad_accum)
    straight = train(TrainConfig(**cfg, out_dir=str(tmp_path / "a")))["model"]
    train(TrainConfig(**cfg, stop_at=4, out_dir=str(tmp_path / "b")))
    resumed = train(TrainConfig(**cfg, resume=True, out_dir=str(tmp_path / "b")))["model"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    steps = [h["step"] for h in map(json.loads, (tmp_path / "b" / "log.jsonl").read_text().splitlines())
             if "loss" in h]
    assert steps == list(range(1, 9))  # the resumed log continues without gaps or repeats


# ---------------------------------------------------------------- gradient accumulation

def _run(out_dir, train_data, **overrides) -> tuple[list[dict], dict, list[torch.Tensor]]:
    """Train on `train_data`; the per-step log records, the final weights, and AdamW's first
    moments from the checkpoint (after one step, 0.1 x the step's gradient, so they check the
    gradient itself, which AdamW's update, invariant to the gradient's scale, would not)."""
    # On the CPU in fp32 whatever the machine: on a GPU the runs train under bf16 autocast and
    # differ by more than summation order (seen on the H200, 2026-11-30: losses 2e-4 apart).
    cfg = TrainConfig(**{**TINY, "device": "cpu", "warmup_steps": 1, "out_dir": str(out_dir), **overrides})
    result = train(cfg, train_data=train_data, eval_data=train_data)
    steps = [h for h in result["history"] if "loss" in h]
    moments = [v for k, v in sorted(_checkpoint_tensors(out_dir).items()) if k.endswith("/exp_avg")]
    return steps, result["model"].state_dict(), moments


def _checkpoint_tensors(out_dir) -> dict:
    """The newest checkpoint's model and optimizer tensors, by name (`optimizer/state/<fqn>/exp_avg`, ...)."""
    from safetensors.torch import load_file

    from genoflash.train.checkpoint import TENSORS, checkpoint_dirs
    (shard,) = (checkpoint_dirs(out_dir)[0] / TENSORS).glob("*.safetensors")  # one process: one file
    return load_file(str(shard))


def _assert_same_training(a, b):
    (steps_a, weights_a, moments_a), (steps_b, weights_b, moments_b) = a, b
    assert [h["step"] for h in steps_a] == [h["step"] for h in steps_b]
    assert [h["loss"] for h in steps_a] == pytest.approx([h["loss"] for h in steps_b], rel=1e-5)
    norms_a, norms_b = ([h.get("grad_norm", 0.0) for h in steps] for steps in (steps_a, steps_b))
    assert norms_a == pytest.approx(norms_b, rel=1e-5)  # the pre-clip norm of the accumulated gradient
    for x, y in zip(moments_a, moments_b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("grad_clip", [0.0, 0.1])  # 0.1: the pre-clip norms are ~0.2-0.9, so clipping acts
def test_grad_accum_equals_one_large_batch(tmp_path, grad_clip):
    # Two steps over 16 fixed samples: batch 8, or 2 x 4, or 4 x 2 per step, must train the
    # same model (fp32 on the CPU; only the summation order differs). Step 1 (samples 8-15)
    # checks that the micro-batches read (step * grad_accum + j) * batch_size onwards.
    data = SyntheticLongRangeDataset(16, 192, 24, seed=0)
    one = _run(tmp_path / "8x1", data, batch_size=8, grad_accum=1, steps=2, grad_clip=grad_clip)
    for batch_size, grad_accum in ((4, 2), (2, 4)):
        name = f"{batch_size}x{grad_accum}"
        _assert_same_training(one, _run(tmp_path / name, data, batch_size=batch_size, grad_accum=grad_accum,
                                        steps=2, grad_clip=grad_clip))
    if grad_clip:
        assert one[0][0]["grad_norm"] > grad_clip  # the clip acted, once, on the accumulated gradient


class TokenDataset(torch.utils.data.Dataset):
    """LM items whose targets are ignored (-100) in varying numbers: items 0-1 have none counted,
    so the micro-batches of a step count different numbers of tokens."""

    def __init__(self, n=8, length=32):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(4, 8, (n, length), generator=g)
        self.labels = torch.randint(4, 8, (n, length), generator=g)
        for i in range(n):
            self.labels[i, : [length, length, 5, 0, 20, 9, 1, 30][i % 8]] = -100

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.labels[i]}


def test_grad_accum_weights_lm_micro_batches_by_counted_tokens(tmp_path):
    # The LM loss is a mean over the counted (non -100) tokens; micro-batches weighted by their
    # token counts give the mean over the whole effective batch, even with a micro-batch of none.
    lm = dict(task="lm", fasta="unused.fa", layer_pattern="G", seq_len=32, steps=2, grad_clip=0.0)
    data = TokenDataset()
    one = _run(tmp_path / "4x1", data, **lm, batch_size=4, grad_accum=1)
    _assert_same_training(one, _run(tmp_path / "2x2", data, **lm, batch_size=2, grad_accum=2))
    _assert_same_training(one, _run(tmp_path / "1x4", data, **lm, batch_size=1, grad_accum=4))


def test_demo_lr_flag_reaches_every_model(tmp_path):
    from genoflash.train import demo
    args = demo.build_parser().parse_args(["--quick", "--device", "cpu", "--lr", "1e-3", "--mixers", "G,H",
                                           "--out-dir", str(tmp_path)])
    assert {cfg.lr for cfg in demo.configs(args).values()} == {1e-3}
    assert {cfg.min_lr for cfg in demo.configs(args).values()} == {1e-3}
    with pytest.raises(ValueError, match="must be a positive number"):
        demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--lr", "-1"]))


def test_grad_accum_flag_and_stream_length():
    from genoflash.train.trainer import build_datasets, micro_batch_starts

    cfg = config_from_args(build_parser().parse_args(["--grad-accum", "4", "--batch-size", "3", "--steps", "5"]))
    assert (cfg.grad_accum, cfg.batch_size) == (4, 3)
    assert TrainConfig().grad_accum == 1
    assert len(build_datasets(cfg)[0]) == 5 * 3 * 4  # every micro-batch reads its own samples
    assert list(micro_batch_starts(2, cfg)) == [24, 27, 30, 33]  # (step * grad_accum + j) * batch_size
    runs = demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--grad-accum", "3"]))
    assert [c.grad_accum for c in runs.values()] == [3, 3]
    assert demo.configs(demo.build_parser().parse_args(["--device", "cpu"]))["full attention"].grad_accum == 1


def test_auroc_hand_computed():
    # Positives 0.8, 0.4, 0.5 against negatives 0.5, 0.3: the six pairs score
    # 1, 1 (0.8); 0, 1 (0.4); 0.5 (a tie), 1 (0.5), so AUROC = 4.5 / 6 = 0.75.
    scores = [0.8, 0.4, 0.5, 0.5, 0.3]
    labels = [1, 1, 1, 0, 0]
    assert auroc(scores, labels) == pytest.approx(4.5 / 6)
    assert auroc([0.1, 0.9], [0, 1]) == 1.0 and auroc([0.9, 0.1], [0, 1]) == 0.0


def test_demo_quick_writes_outputs(tmp_path, capsys):
    from genoflash.cli import main as cli_main
    assert cli_main(["demo", "--quick", "--device", "cpu", "--no-progress", "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"full attention", "local attention"} <= set(summary)
    assert 0 <= summary["full attention"]["accuracy"] <= 1
    assert summary["config"]["sites"] == demo.QUICK["sites"]
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert "local attention" in capsys.readouterr().out


def test_demo_refuses_a_local_model_that_could_see_both_elements():
    # QUICK: gap 96 - 2 * 16 = 64 bases; window 25 gives reach 7 + 2 * 25 = 57, 2 * 57 >= 64.
    with pytest.raises(ValueError, match="could see both elements"):
        demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--window-size", "25"]))
    runs = demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--window-size", "12"]))
    assert [c.layer_pattern for c in runs.values()] == ["G", "L"]


def test_demo_trains_the_chosen_mixers(tmp_path, capsys):
    """--mixers picks the models side by side (the mixer comparison's ladder runs the demo so)."""
    from genoflash.cli import main as cli_main
    assert cli_main(["demo", "--quick", "--device", "cpu", "--no-progress", "--out-dir", str(tmp_path),
                     "--mixers", "G,H,M"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [summary[n]["layer_pattern"] for n in ("full attention", "Hyena", "Mamba (BiMamba)")] == ["G", "H", "M"]
    assert "local attention" not in summary and "local model" not in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"full", "hyena", "mamba"}
    # Without a local model, a window that would see both elements is no reason to refuse.
    runs = demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--window-size", "25",
                                                        "--mixers", "H"]))
    assert [c.layer_pattern for c in runs.values()] == ["H"]
    for bad in ("G,X", "", "G,G"):
        with pytest.raises(ValueError, match="--mixers"):
            demo.configs(demo.build_parser().parse_args(["--quick", "--device", "cpu", "--mixers", bad]))


def test_demo_defaults_keep_the_local_model_blind():
    for sizes in (demo.CPU_DEFAULTS, demo.GPU_DEFAULTS, demo.QUICK):
        gap = sizes["distance"] - sizes["sites"] * (16 + sizes["spacer"])
        assert 2 * demo.local_reach(2, sizes["window_size"]) < gap
        assert sizes["seq_len"] >= sizes["distance"] + sizes["sites"] * (16 + sizes["spacer"]) + 2 * sizes["margin"]


@pytest.mark.slow
def test_demo_full_attention_beats_local_at_cpu_size(tmp_path):
    # The demo's claim at its real CPU size: the global model learns the long-range rule, the
    # local one cannot. About 3 minutes on 2 cores.
    assert demo.main(["--device", "cpu", "--no-progress", "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["full attention"]["accuracy"] >= 0.9
    assert summary["local attention"]["accuracy"] <= 0.62


class FlakyDataset(SyntheticLongRangeDataset):
    """Raises on one index, as a corrupt record would."""

    def __getitem__(self, index):
        if index == 3:
            raise OSError("corrupt record")
        return super().__getitem__(index)


def test_bad_record_is_skipped_and_logged(tmp_path, caplog):
    data = FlakyDataset(64, 192, 24, seed=0)
    cfg = TrainConfig(**TINY, steps=3, out_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING):
        history = train(cfg, train_data=data, eval_data=SyntheticLongRangeDataset(8, 192, 24))["history"]
    assert history[-2]["skipped_samples"] == 1
    assert sum("sample 3" in r.message and "corrupt record" in r.message for r in caplog.records) == 1
    with pytest.raises(OSError, match="corrupt record"):
        train(TrainConfig(**{**TINY, "strict": True}, steps=3, out_dir=str(tmp_path / "strict")),
              train_data=data, eval_data=data)


def test_classifier_ignores_padding():
    from genoflash.models.dna_lm import DNALMConfig
    from genoflash.train import SequenceClassifier

    torch.manual_seed(0)
    model = SequenceClassifier(DNALMConfig(dim=16, depth=2, nheads=2, layer_pattern="LG", window_size=4)).eval()
    tokens = torch.randint(4, 8, (1, 20))
    padded = torch.cat([tokens, torch.zeros(1, 6, dtype=torch.long)], 1)
    both = torch.cat([padded, torch.randint(4, 8, (1, 26))])
    with torch.no_grad():
        torch.testing.assert_close(model(both)["logits"][0], model(tokens)["logits"][0], atol=1e-5, rtol=1e-5)


def test_classifier_takes_input_ids_and_an_attention_mask_and_returns_the_loss_first():
    from genoflash.models.dna_lm import DNALMConfig
    from genoflash.train import SequenceClassifier

    torch.manual_seed(0)
    model = SequenceClassifier(DNALMConfig(dim=16, depth=2, nheads=2, layer_pattern="LG", window_size=4)).eval()
    tokens = torch.randint(4, 8, (2, 17))
    mask = torch.ones_like(tokens)
    mask[1, 11:] = 0  # the same as PAD tokens there
    padded = tokens.clone()
    padded[1, 11:] = 0
    labels = torch.tensor([0, 1])
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out["logits"], model(padded)["logits"], atol=1e-5, rtol=1e-5)
        assert out[0] is out["loss"] and out.loss.dim() == 0
        assert "loss" not in model(tokens) and model(tokens)[0].shape == (2, 2)
    with pytest.raises(TypeError, match="tokens or as input_ids"):
        model(tokens, input_ids=tokens)
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(tokens, attention_mask=mask[:, :5])


def test_model_config_fits_hyena_filters_to_the_run_length():
    # Hyena filters are defined over positions / hyena_l_max; a run's longest sequence is seq_len.
    assert TrainConfig(seq_len=224, distance=112, margin=16).model_config().hyena_l_max == 224
    assert TrainConfig(task="lm", fasta="x.fa", seq_len=4096).model_config().hyena_l_max == 4096


# ---------------------------------------------------------------- checkpoints and guards

CKPT = dict(TINY, steps=6, checkpoint_every=2, device="cpu")


def test_checkpoints_are_data_files_and_the_newest_two_stay(tmp_path):
    from genoflash.train.checkpoint import checkpoint_dirs

    train(TrainConfig(**CKPT, out_dir=str(tmp_path)))
    dirs = checkpoint_dirs(tmp_path)
    assert [d.name for d in dirs] == ["step-00000006", "step-00000004"]  # keep_checkpoints=2
    assert sorted(p.name for p in dirs[0].iterdir()) == ["rng-rank00000.safetensors", "state.json", "tensors"]
    assert [p.suffix for p in (dirs[0] / "tensors").iterdir()] == [".safetensors"]  # no pickle anywhere
    assert not list((tmp_path / "checkpoints").glob(".*"))  # no partial directory left


def _malicious_pickle(path, marker):
    """A file that runs `open(marker, "w")` when unpickled (torch.load with weights_only=False does)."""
    import pickle

    class Payload:
        def __reduce__(self):
            return open, (str(marker), "w")
    path.write_bytes(pickle.dumps(Payload()))


def test_no_code_in_a_checkpoint_runs_on_resume(tmp_path):
    from genoflash.train.checkpoint import CheckpointError, checkpoint_dirs

    marker = tmp_path / "pwned"
    # The old pickled format: refused with a clear error, never unpickled.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    _malicious_pickle(legacy / "checkpoint.pt", marker)
    with pytest.raises(CheckpointError, match="pickled checkpoint"):
        train(TrainConfig(**CKPT, resume=True, out_dir=str(legacy)))
    # A pickle planted in place of a checkpoint's files: they do not load, and nothing runs.
    run = tmp_path / "run"
    train(TrainConfig(**CKPT, out_dir=str(run)))
    for newest in checkpoint_dirs(run):
        for path in [newest / "state.json", newest / "rng-rank00000.safetensors",
                     *(newest / "tensors").glob("*.safetensors")]:
            _malicious_pickle(path, marker)
    with pytest.raises(CheckpointError, match="no checkpoint .* loads"):
        train(TrainConfig(**CKPT, resume=True, out_dir=str(run)))
    assert not marker.exists()


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(tmp_path, caplog):
    from genoflash.train.checkpoint import checkpoint_dirs

    cfg = dict(CKPT, steps=8)
    straight = train(TrainConfig(**cfg, out_dir=str(tmp_path / "a")))["model"]
    run = tmp_path / "b"
    train(TrainConfig(**cfg, stop_at=6, out_dir=str(run)))
    newest = checkpoint_dirs(run)[0]
    assert newest.name == "step-00000006"
    (weights,) = (newest / "tensors").glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a torn write
    with (run / "log.jsonl").open("a") as log:
        log.write('{"step": 7, "lo')  # a line a kill cut short
    with caplog.at_level(logging.WARNING):
        resumed = train(TrainConfig(**cfg, resume=True, out_dir=str(run)))["model"]
    assert "step-00000006 does not load" in caplog.text and "resuming from" in caplog.text
    assert "not whole JSON" in caplog.text
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name  # resumed from step 4, exactly as the straight run
    steps = [h["step"] for h in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in h]
    assert steps == list(range(1, 9))


def test_a_save_cut_short_leaves_the_checkpoints_before_it(tmp_path, monkeypatch):
    from genoflash.train import checkpoint

    run = tmp_path / "run"
    train(TrainConfig(**CKPT, stop_at=4, out_dir=str(run)))
    real_fsync = checkpoint._fsync

    def killed(path):
        if path.name == "state.json":
            raise KeyboardInterrupt  # the process dies mid-save
        real_fsync(path)

    monkeypatch.setattr(checkpoint, "_fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**CKPT, resume=True, out_dir=str(run)))
    monkeypatch.setattr(checkpoint, "_fsync", real_fsync)
    assert [d.name for d in checkpoint.checkpoint_dirs(run)] == ["step-00000004", "step-00000002"]
    assert list((run / "checkpoints").glob(".step-*.partial*"))  # what the kill left
    train(TrainConfig(**CKPT, resume=True, out_dir=str(run)))  # resumes from step 4 and finishes
    assert [d.name for d in checkpoint.checkpoint_dirs(run)] == ["step-00000006", "step-00000004"]
    assert not list((run / "checkpoints").glob(".step-*.partial*"))


def test_a_step_with_a_non_finite_gradient_changes_no_weight(tmp_path, monkeypatch):
    """One step's gradient norm made NaN: that step's update is skipped and logged, and the run
    goes on; the weights stay finite."""
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def nan_at_step_3(parameters, max_norm):
        calls.append(1)
        norm = real(parameters, max_norm)
        return torch.full_like(norm, math.nan) if len(calls) == 3 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", nan_at_step_3)
    result = train(TrainConfig(**CKPT, out_dir=str(tmp_path)))
    skipped = [h for h in result["history"] if "skipped" in h]
    assert [(h["step"], h["skipped"]) for h in skipped] == [(3, "non-finite gradient")]
    assert all(torch.isfinite(p).all() for p in result["model"].parameters())


def test_a_diverging_run_stops_and_keeps_good_weights(tmp_path):
    """At lr 1e6 the loss goes non-finite: the run stops after max_bad_steps such steps in a row with a
    clear error, and every checkpoint holds finite weights."""
    from safetensors.torch import load_file

    from genoflash.train.checkpoint import checkpoint_dirs
    from genoflash.train.trainer import TrainingDiverged

    cfg = TrainConfig(**{**CKPT, "steps": 40, "checkpoint_every": 1, "lr": 1e6, "min_lr": 0.0, "warmup_steps": 0,
                         "grad_clip": 0.0, "max_bad_steps": 3}, out_dir=str(tmp_path))
    with pytest.raises(TrainingDiverged, match="3 steps in a row"):
        train(cfg)
    dirs = checkpoint_dirs(tmp_path)
    assert dirs
    for d in dirs:
        for shard in (d / "tensors").glob("*.safetensors"):  # the weights and the optimizer's moments
            assert all(torch.isfinite(t).all() for t in load_file(str(shard)).values()), d.name
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log if "skipped" in h][-3:] == [h["step"] for h in log if "loss" in h][-3:]


def test_load_trained_model_reads_the_newest_checkpoint(tmp_path):
    from genoflash.train import load_trained_model

    result = train(TrainConfig(**CKPT, out_dir=str(tmp_path)))
    model = load_trained_model(tmp_path)
    assert not model.training
    for (name, a), (_, b) in zip(result["model"].state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name


def test_weight_decay_reaches_matrices_but_not_vectors_mambas_decay_rates_or_hyenas_filters(tmp_path):
    """Each mixer's published recipe: mamba-ssm keeps A_log and D out of weight decay, HyenaDNA its
    implicit filters; biases and norm gains take none either. Read from the optimizer's own groups
    as the checkpoint stores them."""
    train(TrainConfig(**{**TINY, "layer_pattern": "HM", "steps": 1, "weight_decay": 0.05, "device": "cpu",
                         "out_dir": str(tmp_path)}))
    from genoflash.train.checkpoint import checkpoint_dirs

    state = json.loads((checkpoint_dirs(tmp_path)[0] / "state.json").read_text())
    groups = dict(state["optimizer"]["dict"])["param_groups"]["list"]
    decay = {}
    for group in groups:
        fields = dict(group["dict"])
        for name in fields["params"]["list"]:
            decay[name["value"]] = fields["weight_decay"]["value"]
    mamba, hyena = "trunk.blocks.1.mixer.mamba.forward_mamba", "trunk.blocks.0.mixer.hyena"
    for name in (f"{mamba}.in_proj.weight", f"{mamba}.x_proj.weight", f"{mamba}.out_proj.weight",
                 f"{hyena}.in_proj.weight", "trunk.blocks.0.ffn.out.weight", "trunk.embed.weight"):
        assert decay[name] == 0.05, name
    for name in (f"{mamba}.A_log", f"{mamba}.D", f"{mamba}.dt_proj.bias", f"{hyena}.filter.mlp.0.weight",
                 f"{hyena}.filter.mlp.1.freq", "trunk.blocks.0.mixer_norm.weight", f"{hyena}.in_proj.bias"):
        assert decay[name] == 0.0, name
    params = dict(dict(state["optimizer"]["dict"])["state"]["dict"])
    assert set(decay) == set(params)  # every parameter in exactly one group
