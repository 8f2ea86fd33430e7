"""`genoflash bench genome`: the sweep picks each mixer's rate, the ladder runs at it, and the results
file carries a job cut into pieces through to the end."""

import json
import math
from pathlib import Path

import pytest

from genoflash.bench import genome
from genoflash.cli import main as cli_main

FLAGS = ["--val-chroms", "v", "--test-chroms", "t", "--mixers", "attention,hyena", "--contexts", "64,128",
         "--lrs", "1e-3,2e-3,4e-3", "--seeds", "0,1", "--tokens-per-step", "256", "--no-plot"]
BEST = {"attention": 2e-3, "hyena": 4e-3}


def fake_run(calls):
    def one_run(args, mixer, context, lr, seed, runs_dir):
        calls.append((mixer, context, lr, seed))
        # Each mixer's validation loss is lowest at its BEST rate; longer context helps a little.
        val = 1.9 + abs(math.log(lr / BEST[mixer])) - 0.01 * math.log2(context) + 0.001 * seed
        return {"mixer": mixer, "context": context, "lr": lr, "seed": seed, "val_bits": val, "test_bits": val + 0.01,
                "step_ms": 1.0, "peak_gib": None, "parameters": 10, "seconds": 1000.0}
    return one_run


def test_sweep_then_ladder_at_each_mixers_best_rate_resumed_from_the_results_file(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(genome, "one_run", fake_run(calls))
    results = tmp_path / "r.json"
    argv = ["bench", "genome", "--fasta", str(tmp_path / "g.fa"), *FLAGS, "--results", str(results)]
    # A budget shorter than one run: the first run, written, then a stop.
    assert cli_main([*argv, "--time-budget", "500"]) == 0
    assert calls == [("attention", 64, 1e-3, 0)]
    assert list(json.loads(results.read_text())["runs"]) == ["attention/64/0.001/0"]
    assert cli_main(argv) == 0  # the same command goes on
    sweep = [(m, 64, lr, 0) for m in ("attention", "hyena") for lr in (1e-3, 2e-3, 4e-3)]
    assert calls[:6] == sweep  # every sweep first, the finished one not run again
    ladder = calls[6:]
    assert sorted(ladder) == sorted((m, c, BEST[m], s) for m in BEST for c in (64, 128) for s in (0, 1)
                                    if (c, s) != (64, 0))  # the sweep's own run is reused
    report = json.loads(results.read_text())
    assert report["chosen_lr"] == BEST
    rows = {(r["mixer"], r["context"]): r for r in report["summary"]}
    assert set(rows) == {(m, c) for m in BEST for c in (64, 128)}
    assert rows["hyena", 128]["seeds"] == [0, 1] and rows["hyena", 128]["lr"] == 4e-3
    assert all(r["date"] and r["git_commit"] for r in report["runs"].values())
    assert len(report["metadata"]["earlier"]) == 1  # the first call's stamp, kept
    n = len(calls)
    assert cli_main(argv) == 0 and len(calls) == n  # nothing left to run
    # Another setup does not mix into this file.
    with pytest.raises(SystemExit, match="another setup"):
        cli_main([*argv, "--steps", "7"])


def test_bad_flags_name_the_flag(tmp_path):
    base = ["--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t"]
    with pytest.raises(SystemExit):
        genome.parse_args([*base, "--mixers", "attention,transformerxl"])
    with pytest.raises(SystemExit):
        genome.parse_args([*base, "--contexts", "1000", "--tokens-per-step", "4096"])  # not a multiple
    with pytest.raises(SystemExit):
        genome.parse_args([*base, "--mixers", "local-global", "--depth", "6"])


def random_genome(path, lengths: dict[str, int], seed: int):
    """A FASTA of random bases, one record per name."""
    import random

    rng = random.Random(seed)
    path.write_text("".join(f">{c}\n{''.join(rng.choice('ACGT') for _ in range(n))}\n" for c, n in lengths.items()))
    return path


def run_at_cpu_size(tmp_path, fasta, *flags) -> dict:
    """`genoflash bench genome` on the CPU, 2 steps of tiny models by default; its report."""
    results = tmp_path / "r.json"
    assert cli_main(["bench", "genome", "--fasta", str(fasta), "--val-chroms", "v", "--test-chroms", "t",
                     "--lrs", "1e-3", "--seeds", "0", "--dim", "32", "--nheads", "2", "--window", "8",
                     "--steps", "2", "--warmup-steps", "1", "--device", "cpu", "--results", str(results),
                     "--runs-dir", str(tmp_path / "runs"), *flags]) == 0
    assert results.with_suffix(".png").stat().st_size > 0
    return json.loads(results.read_text())


def test_one_real_run_per_mixer_at_cpu_size(tmp_path):
    """Each mixer trains through `genoflash train` and reports its bits and layout (Mamba: twice the
    blocks, no feed-forward), and the plot is drawn."""
    fasta = random_genome(tmp_path / "g.fa", dict.fromkeys(("a", "b", "v", "t"), 3000), seed=0)
    report = run_at_cpu_size(tmp_path, fasta, "--contexts", "32", "--depth", "4", "--tokens-per-step", "64",
                             "--eval-tokens", "64")
    runs = {r["mixer"]: r for r in report["runs"].values()}
    assert set(runs) == set(genome.DEFAULT_MIXERS)
    for r in runs.values():
        # 2 steps from log2(9) = 3.17 bits (the tokenizer's 9 ids) towards random bases' 2
        assert 1.5 < r["val_bits"] < 3.3 and 1.5 < r["test_bits"] < 3.3
    assert runs["mamba"]["depth"] == 8 and runs["mamba"]["ffn_mult"] == 0
    assert runs["local-global"]["layer_pattern"] == "LLLG"


def test_whole_chromosomes_train_windows_then_whole_chromosomes_for_the_same_tokens(tmp_path):
    """`whole`: the run's first steps in windows of --whole-from, its last --whole-steps on one whole
    training chromosome each (resumed from the windows' checkpoint), about the tokens of the other
    contexts' runs; each held-out chromosome is scored whole, and the window stage's score is kept."""
    fasta = random_genome(tmp_path / "g.fa", {"a": 300, "b": 500, "v": 400, "t": 450}, seed=2)
    report = run_at_cpu_size(tmp_path, fasta, "--mixers", "hyena", "--contexts", "32,whole", "--depth", "2",
                             "--tokens-per-step", "128", "--steps", "10", "--whole-steps", "2", "--eval-tokens", "64")
    whole = report["runs"]["hyena/whole/0.001/0"]
    # 2 chromosomes of 400 bases on average read the tokens of 6 steps of 128: 10 - 6 window steps
    assert whole["mean_length"] == 400 and whole["window_context"] == 32
    assert (whole["window_steps"], whole["whole_steps"], whole["steps"]) == (4, 2, 6)
    assert math.isfinite(whole["test_bits"]) and math.isfinite(whole["window_stage"]["test_bits"])
    assert whole["test_bits"] != whole["window_stage"]["test_bits"]  # scored again after the whole stage
    log = [json.loads(line) for line in (tmp_path / "runs" / "hyena_whole_0.001_0" / "log.jsonl").open()]
    lengths = {h["step"]: h["seq_len"] for h in log if "seq_len" in h}
    assert [lengths[s] for s in sorted(lengths)] == [32] * whole["window_steps"] + [500] * whole["whole_steps"]
    assert [h["step"] for h in log if "test" in h] == [4, 6]  # after the windows, then after the whole stage
    # The step time is the whole stage's (its first step, with the compiles, left out), at the mean chromosome.
    whole_rates = [h["tokens_per_s"] for h in log if "tokens_per_s" in h and h["step"] > 4][1:]
    assert whole["step_ms"] == round(400 / whole_rates[0] * 1e3, 2)
    assert [r["context"] for r in report["summary"]] == [32, "whole"]
    # Hyena's filters span the longest chromosome in both stages: the windows learn the filters used whole.
    args = genome.parse_args(["--fasta", str(fasta), "--val-chroms", "v", "--test-chroms", "t", "--contexts",
                              "32,whole", "--tokens-per-step", "128", "--steps", "10", "--whole-steps", "2"])
    stages = [genome.train_config(args, "hyena", "whole", 1e-3, 0, tmp_path, stage) for stage in ("window", "whole")]
    assert [c.model_config().hyena_l_max for c in stages] == [500, 500] and stages[0].seq_len == 32
    with pytest.raises(SystemExit):
        genome.parse_args(["--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t", "--contexts", "whole"])
    with pytest.raises(SystemExit, match="--whole-steps"):  # more whole-chromosome tokens than the budget
        run_at_cpu_size(tmp_path, fasta, "--mixers", "hyena", "--contexts", "32,whole", "--tokens-per-step", "128",
                        "--steps", "6", "--whole-steps", "2", "--results", str(tmp_path / "other.json"))


@pytest.mark.parametrize("task", ["lm", "annotation"])
def test_the_mixers_have_about_the_same_parameters_at_the_default_size(task):
    """Causal Mamba stacks 2 x --depth blocks; BiMamba's blocks hold two Mamba layers, so --depth of them."""
    from genoflash.train.trainer import build_model

    labels = ["--task", "annotation", "--bed", "f.bed", "--label-types", "CDS,tRNA"] if task == "annotation" else []
    args = genome.parse_args(["--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t", *labels])
    counts = {m: sum(p.numel() for p in build_model(genome.train_config(args, m, 4096, 1e-3, 0, "unused"))
                     .parameters()) for m in genome.MIXERS}
    assert max(counts.values()) < 1.1 * min(counts.values()), counts
    assert genome.shape(args)["mamba_depth"] == (4 if task == "annotation" else 8)


def test_the_annotation_task_reports_f1_per_class_beside_a_local_baseline(tmp_path):
    fasta = random_genome(tmp_path / "g.fa", dict.fromkeys(("a", "v", "t"), 2000), seed=1)
    bed = tmp_path / "f.bed"
    bed.write_text("".join(f"{c}\t{s}\t{s + 300}\tf\t0\t+\tCDS\n" for c in ("a", "v", "t") for s in (100, 900)))
    report = run_at_cpu_size(tmp_path, fasta, "--task", "annotation", "--bed", str(bed), "--bed-type-column", "7",
                             "--label-types", "CDS", "--mixers", "local,attention", "--contexts", "32", "--depth",
                             "2", "--tokens-per-step", "64", "--eval-tokens", "640")
    assert report["shape"]["task"] == "annotation" and report["shape"]["label_types"] == "CDS"
    for r in report["runs"].values():
        assert set(r["test_f1"]) == {"none", "CDS", "other"} and 0 <= r["test_macro_f1"] <= 1
        assert r["test_bases"]["CDS"] > 0
    assert {r["mixer"] for r in report["summary"]} == {"local", "attention"}
    assert all("test_macro_f1_mean" in r for r in report["summary"])
    with pytest.raises(SystemExit):
        genome.parse_args(["--task", "annotation", "--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t"])


def test_a_results_file_without_whole_runs_goes_on_when_whole_is_added():
    base = ["--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t", "--contexts", "64,128"]
    before = genome.shape(genome.parse_args(base))
    with_whole = genome.shape(genome.parse_args([*base[:-1], "64,128,whole", "--whole-steps", "4"]))
    assert genome.same_setup(before, with_whole) and genome.same_setup(with_whole, before)
    other = genome.shape(genome.parse_args([*base[:-1], "64,128,whole", "--whole-steps", "5"]))
    assert not genome.same_setup(with_whole, other)  # whole runs of another whole stage do not mix
    assert not genome.same_setup(before, genome.shape(genome.parse_args([*base, "--steps", "7"])))


def test_files_from_before_the_shape_named_mambas_depth_resume_only_where_it_is_unchanged():
    """Older files ran Mamba at 2 x --depth in both tasks: the LM's still matches, the annotation's not."""
    base = ["--fasta", "g.fa", "--val-chroms", "v", "--test-chroms", "t"]
    for task, same in (["lm"], True), (["annotation", "--bed", "f.bed", "--label-types", "CDS"], False):
        now = genome.shape(genome.parse_args([*base, "--task", *task]))
        older = {k: v for k, v in now.items() if k != "mamba_depth"}
        assert genome.same_setup(older, now) is same


def test_speed_times_one_training_step_per_mixer_and_context_without_training(tmp_path):
    fasta = random_genome(tmp_path / "g.fa", {"a": 300, "b": 500, "v": 400, "t": 450}, seed=3)
    results = tmp_path / "speed.json"
    assert cli_main(["bench", "genome", "--speed", "--fasta", str(fasta), "--val-chroms", "v", "--test-chroms", "t",
                     "--mixers", "attention,mamba", "--contexts", "32,whole", "--dim", "32", "--nheads", "2",
                     "--depth", "2", "--window", "8", "--tokens-per-step", "128", "--steps", "10",
                     "--whole-steps", "2", "--device", "cpu", "--results", str(results)]) == 0
    rows = json.loads(results.read_text())["rows"]
    assert [(r["mixer"], r["context"], r["batch_size"], r["seq_len"]) for r in rows] == [
        ("attention", 32, 4, 32), ("attention", "whole", 1, 500), ("mamba", 32, 4, 32), ("mamba", "whole", 1, 500)]
    assert all(r["ms"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert results.with_suffix(".png").stat().st_size > 0
    assert not (tmp_path / "unused").exists()  # nothing trained, nothing written but the results


def test_speed_warms_a_whole_step_up_on_a_short_sequence_of_the_same_residue(monkeypatch):
    """The whole step is timed once, its warm-up a short step whose length keeps seq_len's class mod 16."""
    import torch

    from genoflash.bench import common
    from genoflash.train.trainer import build_model

    seen = []

    def fake(fn, device, *, warmup=None, **kwargs):
        for call in (warmup, fn):
            if call is not None:
                lengths = []
                hook = model.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[-1]))
                call()
                hook.remove()
                seen.append(lengths[0])
        return {"ms": 1.0, "peak_gib": None}

    monkeypatch.setattr(common, "time_and_peak", fake)
    args = genome.parse_args(["--fasta", "x.fa", "--val-chroms", "v", "--test-chroms", "t",
                              "--mixers", "attention", "--contexts", "32,whole",
                              "--dim", "32", "--nheads", "2", "--depth", "1", "--device", "cpu"])
    cfg = genome.train_config(args, "attention", 32, 1e-3, 0, Path("unused"), "window")
    model = build_model(cfg)
    cfg.seq_len, cfg.batch_size = 4096 + 16 + 5, 1
    genome._step_time(model, cfg, torch.device("cpu"), short_warmup=True)
    assert seen == [genome.SHORT_WARMUP_TOKENS + 5, 4096 + 16 + 5]
    seen.clear()
    genome._step_time(model, cfg, torch.device("cpu"))
    assert seen == [4096 + 16 + 5]
