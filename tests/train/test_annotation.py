"""`genoflash train` on a FASTA with chromosomes held out, and the annotation task (a class per base
from a BED): the data split, the metrics against direct computations, a run that learns, and the
configuration errors."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from genoflash.data import FastaFile
from genoflash.train import TrainConfig, load_trained_model, train
from genoflash.train.config import ConfigError
from genoflash.train.parallel import Parallel
from genoflash.train.trainer import BaseTally, build_datasets


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    """Three chromosomes of AT-rich stretches and GC-rich "CDS" stretches (column 7 of a BED6+1),
    and a LTR inside some CDS, which CDS outranks."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("genome")
    fasta, bed = [], []
    for chrom in ("c1", "c2", "c3"):
        parts, pos = [], 0
        while pos < 5000:
            n = rng.randint(100, 300)
            coding = rng.random() < 0.35
            parts.append("".join(rng.choice("GC" if coding else "AT") for _ in range(n)))
            if coding:
                bed.append(f"{chrom}\t{pos}\t{pos + n}\t.\t0\t+\tCDS\n")
                bed.append(f"{chrom}\t{pos + 10}\t{pos + 20}\t.\t0\t+\tLTR\n")
            pos += n
        fasta.append(f">{chrom}\n{''.join(parts)}\n")
    (path / "g.fa").write_text("".join(fasta))
    (path / "f.bed").write_text("".join(bed))
    return path


def config(genome, tmp_path, **overrides) -> TrainConfig:
    fields = dict(task="annotation", fasta=str(genome / "g.fa"), bed=str(genome / "f.bed"), label_types="CDS",
                  bed_type_column=7, val_chroms="c2", test_chroms="c3", seq_len=128, steps=60, batch_size=8,
                  eval_every=30, eval_samples=16, dim=32, nheads=2, layer_pattern="LG", window_size=32,
                  out_dir=str(tmp_path / "run"), progress=False, device="cpu")
    return TrainConfig(**{**fields, **overrides})


@pytest.mark.parametrize("task", ["lm", "annotation"])
def test_windows_come_from_their_own_chromosomes(genome, tmp_path, task):
    train_data, held_out, test = build_datasets(config(genome, tmp_path, task=task, steps=20))
    assert {train_data[i]["chrom"] for i in range(len(train_data))} == {"c1"}
    assert {held_out[i]["chrom"] for i in range(len(held_out))} == {"c2"}
    assert {test[i]["chrom"] for i in range(len(test))} == {"c3"}
    _, held_out, test = build_datasets(config(genome, tmp_path, task=task, val_chroms="", test_chroms=""))
    assert test is None and {held_out[i]["chrom"] for i in range(len(held_out))} == {"c1", "c2", "c3"}


def test_the_annotation_task_learns_and_scores_the_held_out_chromosomes(genome, tmp_path):
    torch.manual_seed(0)
    result = train(config(genome, tmp_path, lr=3e-3))
    test = result["test"]
    assert set(test["f1"]) == {"none", "CDS", "other"}
    assert test["f1"]["CDS"] > 0.9 and test["auprc"]["CDS"] > 0.9 and test["accuracy"] > 0.9
    assert test["bases"]["other"] == 0  # every LTR base lies in a CDS, which outranks it
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "test" in r] == [60] and sum("eval" in r for r in log) == 2
    model = load_trained_model(tmp_path / "run")
    assert log[0]["run"]["parameters"] == sum(p.numel() for p in model.parameters())  # for equal-size comparisons
    assert model.config.num_labels == 3 and not model.config.causal
    assert model(torch.randint(4, 8, (1, 50)))["logits"].shape == (1, 50, 3)


@pytest.mark.parametrize("task", ["lm", "annotation"])
def test_whole_chromosomes_train_and_evaluate_each_held_out_one_once(genome, tmp_path, task):
    cfg = config(genome, tmp_path, task=task, whole_chroms=True, batch_size=1, seq_len=5400, steps=4,
                 eval_every=0, val_chroms="c2,c3", test_chroms="", gradient_checkpointing=True)
    train_data, held_out, test = build_datasets(cfg)
    item = train_data[0]
    assert item["chrom"] == "c1"
    assert len(item["input_ids"]) == FastaFile(genome / "g.fa").contig_length("c1") - (task == "lm")
    assert item["labels"].shape == item["input_ids"].shape
    assert len(held_out) == 2 and [held_out[i]["chrom"] for i in range(2)] == ["c2", "c3"] and test is None
    result = train(cfg)
    assert result["model"].config.gradient_checkpointing
    assert math.isfinite(result["final"]["loss"])
    with pytest.raises(ConfigError, match="seq_len \\(--seq-len\\) is the longest chromosome whole_chroms reads: "
                                          "c[123] has [0-9,]+ bases, more than max_length 1,000"):
        build_datasets(config(genome, tmp_path, task=task, whole_chroms=True, batch_size=1, seq_len=1000 - (task == "lm")))


def test_base_tally_against_direct_computation():
    """F1 from the confusion matrix and AUPRC from the histograms, against sklearn's definitions
    computed here directly (scores on bin centres, so that binning loses nothing)."""
    rng = np.random.default_rng(0)
    c, n = 4, 3000
    logits = torch.from_numpy(rng.normal(size=(2, n // 2, c)) * 2).float()
    targets = torch.from_numpy(rng.integers(0, c, size=(2, n // 2)))
    targets[0, :50] = -100
    targets[targets == 3] = 0  # class 3 never occurs: its F1 counts as NaN only if never predicted
    tally = BaseTally(c)
    probs = logits.softmax(-1)
    bins = BaseTally.BINS
    snapped = (torch.floor(probs * bins) + 0.5) / bins
    tally.add(torch.log(snapped), targets)  # softmax of log(snapped) renormalises: recompute below
    p = (torch.log(snapped)).softmax(-1).reshape(-1, c).numpy()
    y = targets.reshape(-1).numpy()
    p, y = p[y != -100], y[y != -100]
    m = tally.metrics(["a", "b", "c", "d"], Parallel(torch.device("cpu")))
    pred = p.argmax(1)
    for k, name in enumerate("abcd"):
        tp, fp, fn = ((pred == k) & (y == k)).sum(), ((pred == k) & (y != k)).sum(), ((pred != k) & (y == k)).sum()
        f1 = 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else np.nan
        assert m["f1"][name] == pytest.approx(f1, nan_ok=True)
        if (y == k).any():
            # average precision: mean over positives of the precision at their score (ties grouped by bin)
            b = np.minimum((p[:, k] * bins).astype(int), bins - 1)
            ap = np.mean([((b >= b[i]) & (y == k)).sum() / (b >= b[i]).sum() for i in np.flatnonzero(y == k)])
            assert m["auprc"][name] == pytest.approx(ap, rel=1e-9)
        else:
            assert np.isnan(m["auprc"][name])
    assert m["accuracy"] == pytest.approx((pred == y).mean())
    assert m["bases"] == {n_: int((y == k).sum()) for k, n_ in enumerate("abcd")}


@pytest.mark.parametrize("overrides,match", [
    (dict(bed=None), "the annotation task needs a BED of features: --bed PATH"),
    (dict(label_types=None), "label_types \\(--label-types\\) must be comma-separated feature types"),
    (dict(label_types="CDS,,gene"), "label_types \\(--label-types\\) must be comma-separated feature types"),
    (dict(label_types="CDS,other"), "distinct types other than the reserved class names"),
    (dict(bed_type_column=5), "bed_type_column \\(--bed-type-column\\) must be 4 \\(the name\\) or a column"),
    (dict(test_chroms="c2"), "test_chroms \\(--test-chroms\\) must be chromosomes not also in val_chroms"),
    (dict(task="synthetic"), "val_chroms and test_chroms .* hold out chromosomes of a FASTA"),
    (dict(whole_chroms=True), "batch_size \\(--batch-size\\) must be 1 with whole_chroms"),
])
def test_bad_settings_name_their_flag(genome, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        config(genome, tmp_path, **overrides)


@pytest.mark.parametrize("overrides,match", [
    (dict(val_chroms="chrZ"), "val_chroms \\(--val-chroms\\): chrZ not in the FASTA, whose chromosomes are c1, c2, c3"),
    (dict(val_chroms="c1,c2", test_chroms="c3"), "hold out every chromosome"),
])
def test_chromosomes_are_checked_against_the_fasta(genome, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        build_datasets(config(genome, tmp_path, **overrides))
