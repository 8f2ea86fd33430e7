"""The settings of a training run, `TrainConfig`: one typed schema for the YAML file and the flags.

Every value is checked when a TrainConfig is made, wherever it comes from (a YAML file, flags,
code): its type (a number written as text in YAML, such as `lr: 1e-3`, which YAML reads as a
string, is taken as the number), its range, and the combinations that cannot work. A wrong one is a
ConfigError that names the key and its flag. Defaults, then `--config file.yaml`, then the flags
given: `config_from_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
from dataclasses import dataclass, field

from ..data.synthetic import element_length
from ..extras import require
from ..models.dna_lm import LAYER_LETTERS, DNALMConfig
from ..ops.attention import MAX_HEADDIM
from .parallel import DATA_PARALLEL

TASKS = ("synthetic", "lm", "annotation")


class ConfigError(ValueError):
    """A setting of a training run is wrong; the message names the key and its flag."""


def _option(default, help: str):
    return field(default=default, metadata={"help": help})


def flag(name: str) -> str:
    """The command-line flag of a TrainConfig key: seq_len -> --seq-len."""
    return "--" + name.replace("_", "-")


@dataclass
class TrainConfig:
    """Everything a training run depends on; saved as out_dir/config.yaml."""

    task: str = _option("synthetic", "synthetic (long-range classification), lm (causal LM on a FASTA) or "
                                     "annotation (a class per base, from a BED of features)")
    fasta: str | None = _option(None, "FASTA file for the lm and annotation tasks, or the name of a genome shipped "
                                      "with genoflash (arabidopsis-chloroplast, yersinia-plasmid, hg38-fragments)")
    bed: str | None = _option(None, "annotation: BED of annotated features; their types become per-base classes")
    label_types: str | None = _option(None, "annotation: comma-separated feature types, highest priority first: "
                                            "each base is the first type covering it, other where only unlisted "
                                            "types do, none elsewhere (e.g. CDS,tRNA,rRNA,ncRNA,gene)")
    bed_type_column: int = _option(4, "annotation: the BED column holding a feature's type: 4 (the name) or a "
                                      "column from 7 (the file is then read as BED6+n)")
    whole_chroms: bool = _option(False, "lm, annotation: each sequence is a whole chromosome (batch_size 1; seq_len "
                                        "is then the longest chromosome allowed), and the evaluations read each "
                                        "held-out chromosome once")
    gradient_checkpointing: bool = _option(False, "recompute each block in the backward instead of storing its "
                                                  "activations (chromosome-length sequences)")
    val_chroms: str = _option("", "lm, annotation: comma-separated chromosomes held out for the evaluations (empty: "
                                  "held-out windows are drawn from the training chromosomes)")
    test_chroms: str = _option("", "lm, annotation: comma-separated chromosomes held out from training and "
                                   "evaluation, scored once at the end")
    dim: int = _option(64, "model width")
    depth: int = _option(2, "number of blocks")
    nheads: int = _option(4, "attention heads")
    ffn_mult: float = _option(8 / 3, "SwiGLU feed-forward width per block, as a multiple of dim (0: mixer-only "
                                     "blocks, the layout of Mamba's published language models)")
    layer_pattern: str = _option("G", "one letter per layer, repeated to depth: " +
                                 ", ".join(f"{k} {v}" for k, v in LAYER_LETTERS.items()))
    window_size: int = _option(128, "how far a local (L) layer sees, in tokens")
    seq_len: int = _option(512, "tokens per sequence")
    hyena_l_max: int = _option(0, "Hyena (H) layers: the length their implicit filters span (0: seq_len); a run "
                               "resumed at a longer seq_len keeps the first run's filters only with the same value")
    distance: int = _option(256, "synthetic: bases from the enhancer element's start to the promoter's")
    n_families: int = _option(2, "synthetic: motif families")
    motif_length: int = _option(16, "synthetic: bases per motif (binding site)")
    sites: int = _option(1, "synthetic: motif copies per element (homotypic cluster; elements of ~30%% of "
                            "seq_len learned within 300 steps of 16 up to 512 bp; see the synthetic module)")
    spacer: int = _option(0, "synthetic: extra bases per site's slot (each copy jitters within it)")
    margin: int = _option(64, "synthetic: bases kept free of elements at each end")
    steps: int = _option(300, "optimizer steps")
    batch_size: int = _option(16, "sequences per micro-batch (per step when grad_accum is 1)")
    grad_accum: int = _option(1, "micro-batches per optimizer step: the effective batch is batch_size x grad_accum")
    lr: float = _option(3e-3, "peak learning rate")
    min_lr: float = _option(3e-4, "learning rate at the end of the cosine decay")
    weight_decay: float = _option(0.01, "AdamW weight decay on matrices and embeddings (biases, norm gains, "
                                        "Mamba's A_log and D and Hyena's implicit filters take none)")
    warmup_steps: int = _option(20, "linear learning-rate warmup steps")
    grad_clip: float = _option(1.0, "clip the gradient norm to this (0: off)")
    seq_len_warmup: bool = _option(False, "lm: start at seq_len_start and double up to seq_len")
    seq_len_start: int = _option(1024, "lm: first length of the sequence-length warmup")
    seq_len_warmup_fraction: float = _option(0.25, "lm: fraction of the steps the warmup spans")
    log_every: int = _option(10, "steps between log lines")
    eval_every: int = _option(50, "steps between held-out evaluations (0: only at the end)")
    eval_samples: int = _option(256, "held-out sequences per evaluation")
    checkpoint_every: int = _option(100, "steps between checkpoints (one is always written at the end)")
    keep_checkpoints: int = _option(2, "how many of the newest checkpoints to keep")
    max_bad_steps: int = _option(10, "stop after this many steps in a row whose loss or gradient is not finite "
                                     "(each is skipped: no weight changes)")
    stop_at: int = _option(0, "stop after this step with a checkpoint, for time-limited jobs (0: run to steps)")
    out_dir: str = _option("genoflash-train", "logs, checkpoint and plot go here")
    seed: int = _option(0, "seeds the model, the data stream and the grammar")
    device: str = _option("auto", "auto (cuda if available), cpu, cuda or cuda:N")
    strict: bool = _option(False, "fail on a sample that cannot be loaded instead of replacing it")
    resume: bool = _option(False, "continue from the newest checkpoint in out_dir that loads, if there is one")
    progress: bool = _option(True, "show a progress bar")
    context_parallel: int = _option(1, "lm, under torchrun: ranks that share each sequence, each holding a shard "
                                       "(ring attention; global layers only); the data-parallel size is the number "
                                       "of ranks / this")
    data_parallel: str = _option("ddp", "under torchrun: how the data-parallel ranks hold the model: ddp (a whole "
                                        "copy each) or fsdp (FSDP2: parameters, gradients and optimizer state "
                                        "sharded over the ranks, for models that do not fit one GPU)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            setattr(self, f.name, _coerce(f.name, getattr(self, f.name), f.type, f.default))
        self._check()

    def _check(self) -> None:
        def need(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"{key} ({flag(key)}) must be {what}, got {getattr(self, key)!r}")

        need(self.task in TASKS, "task", f"one of {', '.join(TASKS)}")
        if self.task in ("lm", "annotation") and not self.fasta:
            raise ConfigError(f"the {self.task} task needs a FASTA file: --fasta PATH, or the name of a genome "
                              f"shipped with genoflash (arabidopsis-chloroplast, yersinia-plasmid, hg38-fragments)")
        if self.task == "annotation":
            if not self.bed:
                raise ConfigError("the annotation task needs a BED of features: --bed PATH")
            need(bool(self.label_types) and all(self.types()), "label_types",
                 "comma-separated feature types, e.g. CDS,tRNA,gene")
            need(len(set(self.types())) == len(self.types()) and not {"none", "other"} & set(self.types()),
                 "label_types", "distinct types other than the reserved class names none and other")
        need(self.bed_type_column == 4 or self.bed_type_column >= 7, "bed_type_column",
             "4 (the name) or a column number from 7")
        val, test = self.chroms("val_chroms"), self.chroms("test_chroms")
        if (val or test) and self.task == "synthetic":
            raise ConfigError("val_chroms and test_chroms (--val-chroms, --test-chroms) hold out chromosomes of a "
                              "FASTA: the lm and annotation tasks; the synthetic task draws its own sequences")
        need(not set(val) & set(test), "test_chroms", f"chromosomes not also in val_chroms ({', '.join(val)})")
        if self.whole_chroms:
            if self.task == "synthetic":
                raise ConfigError("whole_chroms (--whole-chroms) reads the chromosomes of a FASTA: the lm and "
                                  "annotation tasks")
            need(self.batch_size == 1, "batch_size", "1 with whole_chroms (--whole-chroms): chromosomes differ in "
                 "length")
        for key in ("dim", "depth", "nheads", "window_size", "seq_len", "steps", "batch_size", "grad_accum",
                    "eval_samples", "log_every", "checkpoint_every", "keep_checkpoints", "max_bad_steps",
                    "seq_len_start", "n_families", "motif_length", "sites"):
            need(getattr(self, key) >= 1, key, "a positive integer")
        for key in ("spacer", "margin", "eval_every", "stop_at", "warmup_steps", "seed", "hyena_l_max"):
            need(getattr(self, key) >= 0, key, "an integer >= 0")
        need(not self.hyena_l_max or self.hyena_l_max >= self.seq_len, "hyena_l_max",
             f"0 (seq_len) or at least seq_len ({self.seq_len})")
        need(self.dim % self.nheads == 0, "dim", f"a multiple of nheads ({self.nheads})")
        need(bool(self.layer_pattern) and set(self.layer_pattern) <= set(LAYER_LETTERS), "layer_pattern",
             f"letters of {''.join(LAYER_LETTERS)} ({', '.join(f'{k}: {v}' for k, v in LAYER_LETTERS.items())})")
        need(self.depth % len(self.layer_pattern) == 0, "depth",
             f"a multiple of the length of layer_pattern {self.layer_pattern!r} (it repeats to depth)")
        head_dim = self.dim // self.nheads
        if set(self.layer_pattern) & {"G", "L"}:  # attention layers: the head dims the kernels take
            need(head_dim % 8 == 0 and 8 <= head_dim <= MAX_HEADDIM, "dim",
                 f"nheads ({self.nheads}) x a head dim that is a multiple of 8 between 8 and {MAX_HEADDIM} "
                 f"(dim // nheads = {head_dim})")
        need(math.isfinite(self.ffn_mult) and self.ffn_mult >= 0, "ffn_mult", "a number >= 0 (0: no feed-forward)")
        need(math.isfinite(self.lr) and self.lr > 0, "lr", "a positive number")
        need(math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr, "min_lr", f"in [0, lr = {self.lr}]")
        for key in ("weight_decay", "grad_clip"):  # grad_clip 0: no clipping
            need(math.isfinite(getattr(self, key)) and getattr(self, key) >= 0, key, "a number >= 0")
        need(0 < self.seq_len_warmup_fraction <= 1, "seq_len_warmup_fraction", "in (0, 1]")
        need(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None, "device", "auto, cpu, cuda or cuda:N")
        if self.task == "synthetic":  # the geometry SyntheticLongRangeDataset needs, named by flag here
            need(self.n_families >= 2, "n_families", "at least 2 (a negative pairs two families that do not match)")
            need(self.motif_length >= 4, "motif_length", "at least 4")
            element = element_length(self.sites, self.motif_length, self.spacer)
            need(self.distance >= element, "distance", f"at least an element's length, sites x (motif_length + "
                 f"spacer) = {element} (the elements would overlap)")
            need(self.seq_len >= self.distance + element + 2 * self.margin, "seq_len",
                 f"at least distance + element + 2 x margin = {self.distance + element + 2 * self.margin}")
        need(self.context_parallel >= 1, "context_parallel", "a positive integer (1: each rank reads whole sequences)")
        need(self.data_parallel in DATA_PARALLEL, "data_parallel", f"one of {', '.join(DATA_PARALLEL)}")
        cp = self.context_parallel
        if cp > 1 and self.task == "synthetic":
            raise ConfigError("context_parallel (--context-parallel) shards long sequences of the lm and annotation "
                              "tasks; the synthetic classifier pools over the whole sequence and is not supported")
        if cp > 1 and set(self.layer_pattern) != {"G"}:
            raise ConfigError(f"context_parallel (--context-parallel) needs global layers only (--layer-pattern G): "
                              f"ring attention has no sliding window yet, got {self.layer_pattern!r}")
        if cp > 1:  # the zigzag layout gives each rank two equal chunks of every length trained at
            need(self.seq_len % (2 * cp) == 0, "seq_len", f"a multiple of 2 x context_parallel = {2 * cp}")
            if self.seq_len_warmup:  # the warmup's lengths are seq_len_start doubled, then seq_len
                need(self.seq_len_start % (2 * cp) == 0, "seq_len_start", f"a multiple of 2 x context_parallel = "
                     f"{2 * cp}")

    def types(self) -> list[str]:
        """The annotation task's feature types, in priority order."""
        return [t.strip() for t in (self.label_types or "").split(",")]

    def chroms(self, key: str) -> list[str]:
        """val_chroms or test_chroms as a list of names."""
        return [c.strip() for c in getattr(self, key).split(",") if c.strip()]

    def model_config(self) -> DNALMConfig:
        # Hyena's implicit filters span positions normalised by hyena_l_max: at the default 1M a
        # 224-base sequence would see only the flat first 0.02% of every filter. The longest
        # sequence this run sees is seq_len, unless hyena_l_max says a longer one is to come.
        # The annotation task labels each base from both sides: a bidirectional model
        # (BiMamba for M layers), with classes none, the types, other.
        labels = len(self.types()) + 2 if self.task == "annotation" else None
        return DNALMConfig(dim=self.dim, depth=self.depth, nheads=self.nheads, ffn_mult=self.ffn_mult,
                           causal=self.task == "lm",
                           layer_pattern=self.layer_pattern, window_size=self.window_size,
                           hyena_l_max=self.hyena_l_max or self.seq_len, num_labels=labels,
                           gradient_checkpointing=self.gradient_checkpointing)


# ---------------------------------------------------------------- config loading


def _coerce(key: str, value, annotation: str, default):
    """value as the field's type (annotation: "int", "float", "str", "bool" or "str | None"), or a
    ConfigError naming the key. YAML reads 1e-3 as text: a number written as text is taken."""
    def wrong(expected: str):
        return ConfigError(f"{key} ({flag(key)}) must be {expected}, got {value!r} ({type(value).__name__})")

    if value is None and "None" in annotation:
        return None
    kind = annotation.replace(" | None", "")
    if kind == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if kind == "int":
        if isinstance(value, bool):
            raise wrong("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        raise wrong("an integer")
    if kind == "float":
        if isinstance(value, bool):
            raise wrong("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise wrong("a number")
    if kind == "str":
        if not isinstance(value, str):
            raise wrong("text")
        return value
    raise TypeError(f"TrainConfig.{key}: unhandled annotation {annotation!r}")  # a new field's type


def build_parser(prog: str = "genoflash train") -> argparse.ArgumentParser:
    """One flag per TrainConfig field (``--seq-len`` for seq_len), all defaulting to None so that
    only flags actually given override the YAML file; --help shows each field's default."""
    parser = argparse.ArgumentParser(prog=prog, description="Train a genoflash model: a causal DNA language model "
                                     "on a FASTA file (--task lm) or a classifier on the synthetic long-range task.")
    parser.add_argument("--config", metavar="FILE", help="YAML file of settings (the keys are the flags' names with _); flags "
                                         "override it")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    for f in dataclasses.fields(TrainConfig):
        help = f"{f.metadata['help']} (default: {f.default})"
        if f.type == "bool":
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help)
        else:  # the value stays text here: TrainConfig checks and converts it, as it does YAML's
            parser.add_argument(flag(f.name), default=None, metavar=f.type.replace(" | None", "").upper(), help=help)
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, overridden by the YAML file (if any), overridden by the flags given."""
    values: dict = {}
    if args.config:
        yaml = require("yaml", "train", "--config")
        path = pathlib.Path(args.config)
        if not path.is_file():
            raise ConfigError(f"--config: no such file: {path}")
        values = yaml.safe_load(path.read_text()) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of settings, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(values) - known)
        if unknown:
            import difflib
            hints = [f"{k} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(str(k), known, 1)) else str(k)
                     for k in unknown]
            raise ConfigError(f"{path}: unknown keys: {', '.join(hints)}")
    values.update({k: v for k, v in vars(args).items() if k not in ("config", "debug") and v is not None})
    return TrainConfig(**values)
