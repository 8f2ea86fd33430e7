"""genoflash.train.config and `genoflash train`'s command line: every setting is checked where it is
made (its type, its range, the combinations that cannot work), a wrong one is an error naming the key
and its flag, and a run that cannot start exits with one line and leaves no directory behind."""

import pytest
import yaml

from genoflash.train import ConfigError, TrainConfig
from genoflash.train.config import build_parser, config_from_args
from genoflash.train.trainer import TrainingDiverged, main


def _from(argv):
    return config_from_args(build_parser().parse_args(argv))


def test_yaml_config_and_flag_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"steps": 7, "lr": 0.01, "layer_pattern": "LG", "depth": 4}))
    cfg = _from(["--config", str(path), "--lr", "0.5", "--no-progress"])
    assert (cfg.steps, cfg.lr, cfg.layer_pattern, cfg.depth, cfg.progress) == (7, 0.5, "LG", 4, False)


def test_a_yaml_number_written_as_text_is_taken_as_the_number(tmp_path):
    # PyYAML reads 1e-3 (no dot) as the string "1e-3": the value a user meant is the number.
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-3\nmin_lr: 1e-4\nsteps: 12.0\nseq_len: '640'\n")
    assert isinstance(yaml.safe_load(path.read_text())["lr"], str)  # what makes this test necessary
    cfg = _from(["--config", str(path)])
    assert (cfg.lr, cfg.min_lr, cfg.steps, cfg.seq_len) == (1e-3, 1e-4, 12, 640)
    assert type(cfg.lr) is float and type(cfg.steps) is int


@pytest.mark.parametrize("text, message", [
    ("stepz: 7\n", r"unknown keys: stepz \(did you mean steps\?\)"),
    ("steps: 2.5\n", r"steps \(--steps\) must be an integer, got 2.5"),
    ("progress: 'yes'\n", r"progress \(--progress\) must be true or false, got 'yes'"),
    ("lr: fast\n", r"lr \(--lr\) must be a number, got 'fast'"),
    ("seq_len: -5\n", r"seq_len \(--seq-len\) must be a positive integer, got -5"),
    ("- 1\n- 2\n", "expected a mapping of settings, got list"),
])
def test_a_bad_yaml_file_names_the_key(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        _from(["--config", str(path)])


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="--config: no such file"):
        _from(["--config", str(tmp_path / "nope.yaml")])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_grad_accum_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=r"grad_accum \(--grad-accum\) must be (a positive integer|an integer)"):
        TrainConfig(grad_accum=bad)


@pytest.mark.parametrize("field, bad, message", [
    ("lr", 0.0, r"lr \(--lr\) must be a positive number"), ("lr", float("nan"), "must be a positive number"),
    ("min_lr", -1e-4, r"min_lr \(--min-lr\) must be in \[0, lr"), ("min_lr", 1.0, r"must be in \[0, lr"),
    ("weight_decay", -0.1, r"weight_decay \(--weight-decay\) must be a number >= 0"),
    ("grad_clip", float("inf"), r"grad_clip \(--grad-clip\) must be"),
    ("warmup_steps", -1, r"warmup_steps \(--warmup-steps\) must be an integer >= 0"),
    ("ffn_mult", -0.5, r"ffn_mult \(--ffn-mult\) must be a number >= 0")])
def test_optimizer_settings_out_of_range_are_errors(field, bad, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: bad})


@pytest.mark.parametrize("settings, message", [
    ({"dim": 30, "nheads": 4}, r"dim \(--dim\) must be a multiple of nheads \(4\)"),
    ({"dim": 16, "nheads": 4}, r"dim \(--dim\) must be nheads \(4\) x a head dim that is a multiple of 8 .* = 4\)"),
    ({"depth": 3, "layer_pattern": "LG"}, r"depth \(--depth\) must be a multiple of the length of layer_pattern"),
    ({"layer_pattern": "GX"}, r"layer_pattern \(--layer-pattern\) must be letters of"),
    ({"distance": 8}, r"distance \(--distance\) must be at least an element's length, .* = 16"),
    ({"distance": 400, "seq_len": 512}, r"seq_len \(--seq-len\) must be at least distance \+ element \+ 2 x margin = 544"),
    ({"n_families": 1}, r"n_families \(--n-families\) must be at least 2"),
    ({"device": "gpu"}, r"device \(--device\) must be auto, cpu, cuda or cuda:N"),
    ({"task": "mlm"}, r"task \(--task\) must be one of synthetic, lm"),
    ({"task": "lm"}, "the lm task needs a FASTA file"),
    ({"seq_len_warmup_fraction": 0.0}, r"seq_len_warmup_fraction \(--seq-len-warmup-fraction\) must be in \(0, 1\]"),
    ({"context_parallel": 2}, "synthetic classifier pools over the whole sequence"),
    ({"context_parallel": 2, "task": "lm", "fasta": "x.fa", "layer_pattern": "LG", "depth": 2},
     r"context_parallel \(--context-parallel\) needs global layers only"),
    ({"context_parallel": 3, "task": "lm", "fasta": "x.fa", "seq_len": 512},
     r"seq_len \(--seq-len\) must be a multiple of 2 x context_parallel = 6"),
    ({"context_parallel": 0}, r"context_parallel \(--context-parallel\) must be a positive integer"),
    ({"data_parallel": "zero3"}, r"data_parallel \(--data-parallel\) must be one of ddp, fsdp"),
    ({"hyena_l_max": 256, "seq_len": 512}, r"hyena_l_max \(--hyena-l-max\) must be 0 \(seq_len\) or at least seq_len"),
])
def test_settings_that_cannot_work_together_are_errors(settings, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**settings)


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_grad_accum_flag_rejects_non_positive(bad):
    with pytest.raises(ConfigError, match=f"must be a positive integer, got {bad}"):
        _from(["--grad-accum", bad])


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--seq-len INT" in text and "(default: 512)" in text and "--lr FLOAT" in text
    assert "(default: 0.003)" in text and "--resume, --no-resume" in text


# ---------------------------------------------------------------- the command line's exit


def test_a_bad_flag_exits_2_with_one_line_and_makes_no_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--seq-len", "-5", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "genoflash train: error: seq_len (--seq-len) must be a positive integer, got -5" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("fasta, message", [("missing.fa", "FASTA file not found"),
                                            ("binary.fa", "malformed FASTA file")])
def test_a_bad_fasta_exits_2_and_makes_no_directory(tmp_path, capsys, fasta, message):
    (tmp_path / "binary.fa").write_bytes(b">chr1\nACGT\n>chr1\nACGT\n")  # a name twice: pyfaidx refuses it
    out = tmp_path / "run"
    argv = ["--task", "lm", "--fasta", str(tmp_path / fasta), "--out-dir", str(out), "--steps", "1", "--no-progress"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError):
        main(["--seq-len", "-5", "--out-dir", str(tmp_path / "run"), "--debug"])


def test_a_diverged_run_exits_1(tmp_path, capsys, monkeypatch):
    from genoflash.train import trainer

    def diverge(cfg):
        raise TrainingDiverged("3 steps in a row had a non-finite loss")
    monkeypatch.setattr(trainer, "train", diverge)
    assert main(["--out-dir", str(tmp_path / "run")]) == 1
    assert "3 steps in a row" in capsys.readouterr().err
