"""`genoflash bench genome`: attention, local + global attention, Hyena and Mamba on one genome, held
out by chromosome, as DNA language models (test bits per base against context length) or as per-base
annotators (`--task annotation`: per-class F1 and AUPRC against context), with each mixer's learning
rate swept, several seeds, and the step time and peak memory of every run.

Every model has about the same parameter count and sees the same tokens:
    attention      global attention in every block (G), SwiGLU feed-forward
    local-global   three sliding-window blocks per global one (LLLG), SwiGLU feed-forward
    local          sliding-window blocks only (L): the baseline that sees only local sequence
    hyena          the Hyena operator in every block (H), SwiGLU feed-forward
    mamba          Mamba blocks alone, twice as many (M, no feed-forward: the published Mamba LM's
                   layout, whose mixer holds about the parameters of attention + feed-forward)
Each run is `genoflash train --task lm` (or `annotation`, a bidirectional model labelling each base
from --bed) with the same flags but the mixer's, its learning rate, its context and its seed; a step
reads --tokens-per-step tokens (tokens-per-step / context sequences).

The context `whole` is a model trained, then scored, at whole-chromosome context. From scratch on
whole chromosomes (one per step) the same tokens would buy ~20 optimizer steps, too few to learn
anything, so a `whole` run trains as a user extending a model's context would: windows of
--whole-from first, then its last --whole-steps steps on whole training chromosomes (`genoflash
train --whole-chroms`, resumed from the windows' checkpoint; one learning-rate schedule over both),
with fewer window steps so that the run reads about the same tokens as the others. Each held-out
chromosome is then scored whole. The record keeps the window stage's test scores beside the final.

Two stages, in one command:
    sweep   each mixer at every --lrs value, at --sweep-context, seed the first of --seeds;
    ladder  each mixer at the rate whose held-out (validation) loss was lowest, at every --contexts
            value and every seed (the sweep's run is reused where it matches).
The test loss is the mean per-base cross-entropy over held-out windows of the run's context from the
--test-chroms chromosomes (about --eval-tokens bases at every context), in bits (an LM at chance: 2);
the annotation task adds the test bases' macro F1 and each class's F1 and AUPRC.

The results file is also the command's state: each run is written to it as soon as it ends, and a
run already in it is not run again. So a job cut into pieces (--time-budget stops before a run that
would not fit) goes on where it stopped when the same command runs again.

    genoflash bench genome --fasta sacCer_S288C.fa --val-chroms chrXV --test-chroms chrXVI \\
        --contexts 1024,4096,16384,65536,262144 --lrs 1e-3,2e-3,4e-3 --seeds 0,1 --results genome-lm.json
    genoflash bench genome --task annotation --bed sacCer_S288C.annotations.bed --bed-type-column 7 \\
        --label-types CDS,tRNA,rRNA,ncRNA,gene --mixers local,attention,hyena,mamba \\
        --contexts 8192,65536,whole --gradient-checkpointing-from 262144 ...

Results: the JSON (with device, date, commit and versions) and, beside it, a plot of test bits per
base against context, of step time against context, and of the sweep.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from .common import RESULTS_DIR, pyplot, results_stem, run_metadata, save_figure, title_stamp, write_json

# name -> (layer_pattern, depth multiplier, SwiGLU width as a multiple of dim; 0: none). Mamba's blocks
# have no feed-forward, so the causal LM stacks twice as many to match the others' parameters; see
# mixer_depth for the bidirectional models.
MIXERS = {"attention": ("G", 1, 8 / 3), "local-global": ("LLLG", 1, 8 / 3), "local": ("L", 1, 8 / 3),
          "hyena": ("H", 1, 8 / 3), "mamba": ("M", 2, 0.0)}
DEFAULT_MIXERS = ("attention", "local-global", "hyena", "mamba")
# What must match for a results file's runs to be comparable with this command's.
LN2 = math.log(2)
WHOLE = "whole"  # the context of whole chromosomes
WHOLE_SETTINGS = ("whole_steps", "whole_from")  # in the shape only when the ladder has `whole`


def mixer_depth(args, mixer: str) -> int:
    """Blocks of `mixer`'s model. A BiMamba block holds two Mamba layers (one per direction, untied),
    so the bidirectional annotation model takes --depth of them, not twice: both then have about the
    parameters of the attention models (3.5M against 3.2M at the defaults)."""
    _, depth_mult, _ = MIXERS[mixer]
    return args.depth * (1 if mixer == "mamba" and args.task == "annotation" else depth_mult)


def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v.strip()]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="genoflash bench genome", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=("lm", "annotation"), default="lm", help="lm: a causal DNA LM; annotation: "
                   "a class per base from --bed")
    p.add_argument("--fasta", required=True, help="the genome (FASTA; an index is built beside it if missing)")
    p.add_argument("--bed", help="annotation: the BED of features (genoflash train --bed)")
    p.add_argument("--label-types", help="annotation: feature types, highest priority first (genoflash train "
                   "--label-types)")
    p.add_argument("--bed-type-column", type=int, default=4, help="annotation: the BED column of the type")
    p.add_argument("--val-chroms", required=True, help="comma-separated chromosomes for the validation loss")
    p.add_argument("--test-chroms", required=True, help="comma-separated chromosomes for the test loss")
    p.add_argument("--mixers", default=",".join(DEFAULT_MIXERS), help=f"comma-separated, of {', '.join(MIXERS)}")
    p.add_argument("--contexts", default="1024,4096,16384", help="the ladder's context lengths (tokens); "
                   "`whole`: whole chromosomes")
    p.add_argument("--whole-steps", type=int, default=8, help="`whole`: the run's last steps, each on one whole "
                   "training chromosome")
    p.add_argument("--whole-from", type=int, default=None, help="`whole`: the context of the run's first steps, "
                   "in windows (default: the longest of --contexts)")
    p.add_argument("--sweep-context", type=int, default=None, help="the sweep's context (default: the "
                   "shortest of --contexts)")
    p.add_argument("--lrs", default="1e-3,2e-3,4e-3", help="the learning rates of the sweep (at least 3 to "
                   "tell a tuned mixer from an untuned one)")
    p.add_argument("--seeds", default="0,1", help="the ladder's seeds; the sweep uses the first")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--depth", type=int, default=4, help="blocks (the causal Mamba LM: twice as many, without "
                   "feed-forward; BiMamba: as many, each two Mamba layers)")
    p.add_argument("--nheads", type=int, default=4, help="attention heads")
    p.add_argument("--window", type=int, default=512, help="the local layers' window (local-global)")
    p.add_argument("--tokens-per-step", type=int, default=65536, help="tokens per optimizer step at every context")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-tokens", type=int, default=1 << 20, help="held-out bases per evaluation (validation "
                   "and test each), at every context")
    p.add_argument("--gradient-checkpointing-from", type=int, default=0, help="recompute each block in the "
                   "backward at contexts from this length (0: never)")
    p.add_argument("--results", type=Path, default=None, help="results JSON, read first to skip the runs it "
                   "holds (default: <out>/<device>-<date>-genome-<task>.json)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the default results file goes")
    p.add_argument("--runs-dir", type=Path, default=None, help="the runs' directories (logs, checkpoints); "
                   "default: a temporary folder, deleted at the end")
    p.add_argument("--time-budget", type=float, default=0, help="seconds: start no run that would end past it, "
                   "guessed from the finished runs of its mixer and context, else the slowest (0: no limit); the "
                   "same command later goes on")
    p.add_argument("--speed", action="store_true", help="train nothing: time one training step of each mixer's "
                   "model at each context (`whole`: the longest chromosome) and take its peak memory")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.mixer_names = [m.strip() for m in args.mixers.split(",") if m.strip()]
    for name in args.mixer_names:
        if name not in MIXERS:
            p.error(f"--mixers: unknown mixer {name!r}; choose from {', '.join(MIXERS)}")
    contexts = [c.strip() for c in args.contexts.split(",") if c.strip()]
    whole = [WHOLE] if WHOLE in contexts else []
    args.context_list = _ints(",".join(c for c in contexts if c != WHOLE)) + whole
    args.lr_list, args.seed_list = _floats(args.lrs), _ints(args.seeds)
    if not args.context_list or not args.lr_list or not args.seed_list:
        p.error("--contexts, --lrs and --seeds each need at least one value")
    numeric = [c for c in args.context_list if c != WHOLE]
    if args.sweep_context is None and not numeric:
        p.error("--sweep-context: give one (a number of tokens) when --contexts has only `whole`")
    args.sweep_context = args.sweep_context or min(numeric)
    args.whole_from = args.whole_from or max(numeric, default=args.sweep_context)
    for c in [*numeric, args.sweep_context, *([args.whole_from] if WHOLE in contexts else [])]:
        if c < 2 or args.tokens_per_step % c:
            p.error(f"--tokens-per-step ({args.tokens_per_step}) must be a multiple of every context, got {c}")
    if "local-global" in args.mixer_names and args.depth % 4:
        p.error(f"--depth must be a multiple of 4 for local-global (LLLG), got {args.depth}")
    if WHOLE in contexts and args.whole_steps < 1:
        p.error(f"--whole-steps must be >= 1, got {args.whole_steps}")
    if args.task == "annotation" and not (args.bed and args.label_types):
        p.error("--task annotation needs --bed and --label-types")
    return args


def shape(args) -> dict:
    """What must match for a results file's runs to be comparable with this command's."""
    labels = ({"bed": os.path.basename(args.bed), "label_types": args.label_types,
               "bed_type_column": args.bed_type_column} if args.task == "annotation" else {})
    return {"task": args.task, **labels,
            "fasta": os.path.basename(args.fasta), "val_chroms": args.val_chroms, "test_chroms": args.test_chroms,
            "dim": args.dim, "depth": args.depth, "nheads": args.nheads, "window": args.window,
            "tokens_per_step": args.tokens_per_step, "steps": args.steps, "warmup_steps": args.warmup_steps,
            "eval_tokens": args.eval_tokens, "weight_decay": args.weight_decay,
            "mamba_depth": mixer_depth(args, "mamba"),
            **({"whole_steps": args.whole_steps, "whole_from": args.whole_from} if WHOLE in args.context_list else {})}


def same_setup(previous: dict, now: dict) -> bool:
    """Whether a results file's runs compare with this command's: the same shape, where a file that
    never ran `whole` (so recorded no whole-run settings) matches a command that adds it."""
    if not isinstance(previous, dict):
        return False
    # Files written before the shape named Mamba's depth ran it at twice --depth for both tasks.
    previous = {"mamba_depth": 2 * previous.get("depth", 0), **previous}
    keys = (set(previous) | set(now)) - {k for k in WHOLE_SETTINGS if (k in previous) != (k in now)}
    return all(previous.get(k) == now.get(k) for k in keys)


def run_key(mixer: str, context: int, lr: float, seed: int) -> str:
    return f"{mixer}/{context}/{lr:g}/{seed}"


@functools.lru_cache(maxsize=4)
def chromosome_lengths(fasta_path: str) -> dict[str, int]:
    """The FASTA's chromosomes' lengths (read once per file)."""
    from ..data.fasta import FastaFile
    fasta = FastaFile(fasta_path)
    return {c: fasta.contig_length(c) for c in fasta.contigs}


def whole_shape(args) -> tuple[int, int, int]:
    """(longest chromosome, mean training chromosome, window steps) of a `whole` run: its window
    steps and its --whole-steps chromosomes read about --steps x --tokens-per-step tokens."""
    lengths = chromosome_lengths(args.fasta)
    held = {c.strip() for c in f"{args.val_chroms},{args.test_chroms}".split(",") if c.strip()}
    train = [n for c, n in lengths.items() if c not in held]
    mean = sum(train) // max(len(train), 1)
    return max(lengths.values()), mean, args.steps - round(args.whole_steps * mean / args.tokens_per_step)


def train_config(args, mixer: str, context, lr: float, seed: int, out_dir: Path, stage: str = "window"):
    """The run's `genoflash train` config; a `whole` run has two, its `stage` "window" and "whole"
    (the same model, steps and schedule: the second resumes the first's checkpoint)."""
    from ..train.config import TrainConfig

    pattern, _, ffn_mult = MIXERS[mixer]
    steps, extra = args.steps, {}
    if context == WHOLE:
        longest, _, window_steps = whole_shape(args)
        steps = window_steps + args.whole_steps
        extra["hyena_l_max"] = longest  # both stages: the filters the windows learn are those used whole
        if stage == "whole":  # scored on each held-out chromosome whole, once, at the end
            geometry = dict(whole_chroms=True, seq_len=longest, batch_size=1, eval_samples=1, resume=True,
                            eval_every=0, log_every=1)
        else:
            context = args.whole_from
            geometry = dict(seq_len=context, batch_size=args.tokens_per_step // context, stop_at=window_steps,
                            eval_samples=max(args.eval_tokens // context, 1), eval_every=max(window_steps // 6, 1),
                            log_every=max(steps // 30, 1))
    else:
        geometry = dict(seq_len=context, batch_size=args.tokens_per_step // context,
                        eval_samples=max(args.eval_tokens // context, 1), eval_every=max(steps // 6, 1),
                        log_every=max(steps // 30, 1))
    length = geometry["seq_len"]
    labels = (dict(bed=args.bed, label_types=args.label_types, bed_type_column=args.bed_type_column)
              if args.task == "annotation" else {})
    return TrainConfig(task=args.task, **labels, **extra, fasta=args.fasta, val_chroms=args.val_chroms,
                       test_chroms=args.test_chroms,
                       dim=args.dim, depth=mixer_depth(args, mixer), nheads=args.nheads, ffn_mult=ffn_mult,
                       layer_pattern=pattern, window_size=args.window, **geometry, steps=steps, lr=lr,
                       min_lr=lr / 10, warmup_steps=min(args.warmup_steps, steps // 2), weight_decay=args.weight_decay,
                       checkpoint_every=steps,
                       keep_checkpoints=1, gradient_checkpointing=bool(args.gradient_checkpointing_from)
                       and length >= args.gradient_checkpointing_from,
                       out_dir=str(out_dir), seed=seed, device=args.device, progress=False)


def one_run(args, mixer: str, context: int, lr: float, seed: int, runs_dir: Path) -> dict:
    """Train one model; its record (diverged runs included, with the loss as inf)."""
    import torch

    from ..train.trainer import TrainingDiverged, train

    out_dir = runs_dir / run_key(mixer, context, lr, seed).replace("/", "_")
    cfg = train_config(args, mixer, context, lr, seed, out_dir)
    record = {"mixer": mixer, "layer_pattern": cfg.layer_pattern, "depth": cfg.depth, "ffn_mult": cfg.ffn_mult,
              "context": context, "lr": lr, "seed": seed, "batch_size": cfg.batch_size, "steps": cfg.steps,
              "gradient_checkpointing": cfg.gradient_checkpointing}
    step_tokens, timed_from = args.tokens_per_step, 0  # the steps timed: those after `timed_from`
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        result = train(cfg)
        if context == WHOLE:  # the window stage ended at its stop_at; the whole stage resumes there
            _, step_tokens, timed_from = whole_shape(args)  # tokens per whole step: the chromosomes' mean
            record.update(window_context=cfg.seq_len, window_steps=timed_from, whole_steps=args.whole_steps,
                          mean_length=step_tokens, window_stage=_test_scores(result, args.task))
            cfg = train_config(args, mixer, context, lr, seed, out_dir, stage="whole")
            record["gradient_checkpointing"] = cfg.gradient_checkpointing
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            result = train(cfg)
    except TrainingDiverged as err:
        return {**record, "diverged": str(err), "val_bits": math.inf, "test_bits": math.inf,
                "seconds": round(time.perf_counter() - start, 1)}
    history = result["history"]
    timed = [h for h in history if h["step"] > timed_from]
    rates = [h["tokens_per_s"] for h in timed if "tokens_per_s" in h][1:]  # the first holds the compiles
    evals = [(h["step"], h["eval"]["loss"] / LN2) for h in history if "eval" in h]
    peak = max((h.get("gpu_mem_gib", 0.0) for h in timed), default=0.0)
    val = result["final"]["loss"] / LN2
    record.update(parameters=sum(p.numel() for p in result["model"].parameters()),
                  val_bits=round(val, 5) if math.isfinite(val) else math.inf,
                  step_ms=round(step_tokens / statistics.median(rates) * 1e3, 2) if rates else None,
                  peak_gib=round(peak, 3) or None, val_curve=[[s, round(b, 5)] for s, b in evals],
                  seconds=round(time.perf_counter() - start, 1), **_test_scores(result, args.task))
    return record


def _test_scores(result: dict, task: str) -> dict:
    """A trained run's test bits per base, and for the annotation task its F1 and AUPRC."""
    test = result["test"]
    bits = test["loss"] / LN2
    scores = {"test_bits": round(bits, 5) if math.isfinite(bits) else math.inf}
    if task == "annotation":
        scores.update(test_macro_f1=round(test["macro_f1"], 5),
                      test_f1={k: round(v, 5) for k, v in test["f1"].items()},
                      test_auprc={k: round(v, 5) for k, v in test["auprc"].items()}, test_bases=test["bases"])
    return scores


def _stamp(record: dict, metadata: dict) -> dict:
    """The record with where and when it ran (a results file gathers runs of several calls)."""
    return {**record, **{k: metadata[k] for k in ("device", "date", "git_commit")}}


def best_lrs(runs: dict, args) -> dict[str, float | None]:
    """Each mixer's sweep rate with the lowest validation loss (None until its sweep is complete)."""
    chosen = {}
    for mixer in args.mixer_names:
        sweep = [runs.get(run_key(mixer, args.sweep_context, lr, args.seed_list[0])) for lr in args.lr_list]
        chosen[mixer] = None if None in sweep else min(sweep, key=lambda r: r["val_bits"])["lr"]
    return chosen


def plan(runs: dict, args) -> list[tuple[str, int, float, int]]:
    """The runs still to do, sweep first: a ladder run waits for its mixer's sweep."""
    todo = [(m, args.sweep_context, lr, args.seed_list[0]) for m in args.mixer_names for lr in args.lr_list]
    chosen = best_lrs(runs, args)
    for m in args.mixer_names:
        if chosen[m] is not None:
            todo += [(m, c, chosen[m], s) for s in args.seed_list for c in args.context_list]
    seen, out = set(), []
    for t in todo:
        if run_key(*t) not in runs and run_key(*t) not in seen:
            seen.add(run_key(*t))
            out.append(t)
    return out


def summary(runs: dict, args) -> list[dict]:
    """Per mixer and context, at the chosen rate: test bits (mean and each seed), step time, peak."""
    rows = []
    for mixer, lr in best_lrs(runs, args).items():
        if lr is None:
            continue
        for c in args.context_list:
            done = [runs[k] for s in args.seed_list if (k := run_key(mixer, c, lr, s)) in runs]
            if not done:
                continue
            bits = [r["test_bits"] for r in done]
            row = {"mixer": mixer, "context": c, "lr": lr, "seeds": [r["seed"] for r in done],
                   "test_bits": bits, "test_bits_mean": round(sum(bits) / len(bits), 5),
                   "step_ms": done[0].get("step_ms"), "peak_gib": done[0].get("peak_gib"),
                   "parameters": done[0].get("parameters")}
            if c == WHOLE:
                row["mean_length"] = done[0]["mean_length"]
            if args.task == "annotation" and all("test_macro_f1" in r for r in done):
                f1 = [r["test_macro_f1"] for r in done]
                row.update(test_macro_f1=f1, test_macro_f1_mean=round(sum(f1) / len(f1), 5),
                           test_f1_mean={k: round(sum(r["test_f1"][k] for r in done) / len(done), 5)
                                         for k in done[0]["test_f1"]},
                           test_auprc_mean={k: round(sum(r["test_auprc"][k] for r in done) / len(done), 5)
                                            for k in done[0]["test_auprc"]})
            rows.append(row)
    return rows


def plot(report: dict, path: Path, args) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    rows = report["summary"]

    def x(row) -> int:  # whole chromosomes sit at the training chromosomes' mean length
        return row["mean_length"] if row["context"] == WHOLE else row["context"]

    metric = "test_macro_f1" if args.task == "annotation" else "test_bits"  # per seed; + "_mean"
    for mixer in args.mixer_names:
        mine = [r for r in rows if r["mixer"] == mixer and metric in r]
        if mine:
            axes[0].plot([x(r) for r in mine], [r[metric + "_mean"] for r in mine], "o-",
                         label=f"{mixer} (lr {mine[0]['lr']:g})")
            for r in mine:
                axes[0].scatter([x(r)] * len(r[metric]), r[metric], s=10, color="gray", zorder=3)
            timed = [r for r in mine if r["step_ms"]]
            axes[1].plot([x(r) for r in timed], [r["step_ms"] for r in timed], "o-", label=mixer)
        sweep = [r for r in report["runs"].values() if r["mixer"] == mixer and r["context"] == args.sweep_context
                 and r["seed"] == args.seed_list[0] and r["lr"] in args.lr_list]
        if sweep:
            sweep.sort(key=lambda r: r["lr"])
            axes[2].plot([r["lr"] for r in sweep], [min(r["val_bits"], 2.5) for r in sweep], "o-", label=mixer)
    if args.task == "annotation":
        axes[0].set(xscale="log", xlabel="context (tokens)", ylabel="test macro F1 (per-base classes)",
                    title="held-out chromosomes, annotation")
    else:
        axes[0].axhline(2.0, color="gray", ls=":", lw=1, label="chance (2 bits)")
        axes[0].set(xscale="log", xlabel="context (tokens)", ylabel="test bits per base",
                    title="held-out chromosomes, per-base cross-entropy")
    axes[1].set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms per step",
                title=f"training step ({args.tokens_per_step:,} tokens"
                + ("; whole: one chromosome)" if WHOLE in args.context_list else ")")
                # Runs made side by side on one GPU (recorded in the metadata) did not time solo steps.
                + ("\nshared GPU: not solo times (--speed times them)" if report["metadata"].get("shared_gpu") else ""))
    axes[2].set(xscale="log", xlabel="peak learning rate", ylabel="validation cross-entropy, bits (capped 2.5)",
                title=f"learning-rate sweep at {args.sweep_context:,}")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    what = "per-base annotation" if args.task == "annotation" else "DNA LMs"
    fig.suptitle(f"{what} on {report['shape']['fasta']}: {title_stamp(report['metadata'])}")
    save_figure(fig, path)


def _write(path: Path, report: dict) -> None:
    """Atomically: a kill mid-write leaves the previous file whole."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    write_json(tmp, report)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    import torch

    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    metadata = run_metadata(device, command="genoflash bench genome")
    _, mean, window_steps = whole_shape(args) if WHOLE in args.context_list else (0, 0, 1)
    if window_steps < 1:
        raise SystemExit(f"--whole-steps: {args.whole_steps} whole chromosomes (about {mean:,} "
                         f"bases each) read more than --steps x --tokens-per-step ({args.steps} x "
                         f"{args.tokens_per_step:,}) tokens, leaving {window_steps} window steps")
    if args.speed:
        return speed(args, device, metadata)
    path = args.results or results_stem(args.out, metadata, f"genome-{args.task}").with_suffix(".json")
    report = {"metadata": metadata, "shape": shape(args), "runs": {}, "summary": []}
    if path.exists():
        previous = json.loads(path.read_text())
        if not same_setup(previous.get("shape"), report["shape"]):
            raise SystemExit(f"{path} holds runs of another setup ({previous.get('shape')}); this command's is "
                             f"{report['shape']}: use another --results file")
        report["runs"] = previous["runs"]
        report["metadata"]["earlier"] = previous["metadata"].get("earlier", []) + [
            {k: previous["metadata"][k] for k in ("device", "date", "git_commit") if k in previous["metadata"]}]
    with tempfile.TemporaryDirectory(prefix="genoflash-genome-") as scratch:
        # Without --runs-dir each run's directory (its checkpoint) goes with the scratch folder.
        _run_all(args, report, path, metadata, args.runs_dir or Path(scratch))
    report["summary"] = summary(report["runs"], args)
    report["chosen_lr"] = best_lrs(report["runs"], args)
    _write(path, report)
    if not args.no_plot and report["summary"]:
        plot(report, path.with_suffix(".png"), args)
    print(f"results: {path}")
    return 0


def _run_all(args, report: dict, path: Path, metadata: dict, runs_dir: Path) -> None:
    """The planned runs in order, each written to `path` as it ends, until none is left or the
    time budget would be passed."""
    runs = report["runs"]
    began = time.perf_counter()
    while todo := plan(runs, args):
        mixer, context, lr, seed = todo[0]
        # The run's length, guessed from the finished runs of its mixer and context, else from the
        # slowest of all (the first run of a context longer than any yet may still overrun).
        like = [r["seconds"] for r in runs.values() if (r["mixer"], r["context"]) == (mixer, context)]
        guess = max(like or [r["seconds"] for r in runs.values()], default=0.0)
        if args.time_budget and time.perf_counter() - began + guess > args.time_budget:
            print(f"time budget: {len(todo)} runs left for a later call of the same command")
            break
        print(f"[{len(runs) + 1}] {mixer} context {context if context == WHOLE else f'{context:,}'} lr {lr:g} "
              f"seed {seed} ...", flush=True)
        record = _stamp(one_run(args, mixer, context, lr, seed, runs_dir), metadata)
        runs[run_key(mixer, context, lr, seed)] = record
        f1 = f", test macro F1 {record['test_macro_f1']:.4f}" if "test_macro_f1" in record else ""
        print(f"    val {record['val_bits']:.4f} test {record['test_bits']:.4f} bits/base{f1}, "
              f"{record.get('step_ms')} ms/step, peak {record.get('peak_gib')} GiB, {record['seconds']} s", flush=True)
        report["summary"] = summary(runs, args)
        report["chosen_lr"] = best_lrs(runs, args)
        _write(path, report)


# ---------------------------------------------------------------- --speed

def speed(args, device, metadata: dict) -> int:
    """Each mixer's model, as its runs train it, at each context: one training step (bf16 forward,
    cross-entropy, backward, AdamW step) on random tokens, timed and its peak memory taken as
    `genoflash bench mixers` takes them (common.time_and_peak). `whole` is one sequence of the
    longest chromosome, checkpointed per --gradient-checkpointing-from. A mixer ends at its first
    out-of-memory. Writes <stem>-speed.json (after every point) and a plot of both.
    `whole` steps take up to minutes (full attention over chrIV), so theirs is timed once, after a
    warm-up on a short sequence that compiles the same kernels (see _step_time)."""
    import torch

    from ..train.trainer import build_model
    from .common import free_cached_memory

    path = args.results or results_stem(args.out, metadata, f"genome-{args.task}-speed").with_suffix(".json")
    report = {"metadata": metadata, "shape": shape(args), "rows": []}
    for mixer in args.mixer_names:
        for context in args.context_list:
            stage = "whole" if context == WHOLE else "window"
            cfg = train_config(args, mixer, context, args.lr_list[0], 0, Path("unused"), stage)
            row = {"mixer": mixer, "context": context, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                   "tokens": cfg.seq_len * cfg.batch_size, "gradient_checkpointing": cfg.gradient_checkpointing}
            try:
                row.update(_step_time(build_model(cfg).to(device), cfg, device, short_warmup=stage == "whole"))
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
            finally:
                free_cached_memory(device)
            report["rows"].append(row)
            shown = row.get("error") or f"{row['ms']:10.1f} ms, peak {row['peak_gib'] or 0:.2f} GiB"
            print(f"{mixer:13s} {context if context == WHOLE else f'{context:,}':>9s}  {shown}", flush=True)
            _write(path, report)
            if "error" in row:
                break
    if not args.no_plot:
        plot_speed(report, path.with_suffix(".png"))
    print(f"results: {path}")
    return 0


# A warm-up length for `whole` steps: a multiple of 16 plus the chromosome's residue mod 16 keeps
# every length-derived integer Triton specialises on (divisibility by 16, == 1) in the same class,
# so the warm-up compiles exactly the kernels the timed step runs.
SHORT_WARMUP_TOKENS = 4096


def _step_time(model, cfg, device, short_warmup: bool = False) -> dict:
    """{"ms", "peak_gib", "tokens_per_s"} of one training step of `model` at cfg's geometry. With
    short_warmup, the warm-up step runs on SHORT_WARMUP_TOKENS + (seq_len mod 16) tokens instead of
    seq_len (time_and_peak's `warmup`); the timed step is the full one."""
    import torch
    import torch.nn.functional as F

    from .common import time_and_peak

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    classes = model.lm_head.out_features

    def step_of(seq_len: int):
        tokens = torch.randint(4, 8, (cfg.batch_size, seq_len), device=device)  # the tokenizer's A, C, G, T ids
        targets = torch.randint(0, classes, (cfg.batch_size, seq_len), device=device)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(tokens)["logits"]
            F.cross_entropy(logits.reshape(-1, classes).float(), targets.reshape(-1)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    short = SHORT_WARMUP_TOKENS + cfg.seq_len % 16
    warmup = step_of(short) if short_warmup and short < cfg.seq_len else None
    timing = time_and_peak(step_of(cfg.seq_len), device, warmup_ms=5, rep_ms=50, time_once_above_ms=1000,
                           warmup=warmup)
    return {**timing, "tokens_per_s": round(cfg.seq_len * cfg.batch_size / (timing["ms"] * 1e-3))}


def plot_speed(report: dict, path: Path) -> None:
    """Step time, throughput and peak memory against the sequence length. Steps hold different token
    counts (the windows' tokens per step; `whole`: one chromosome), so throughput is the comparable
    panel; hollow markers are checkpointed steps (their peak is not the same trade-off)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    for i, mixer in enumerate(dict.fromkeys(r["mixer"] for r in report["rows"])):
        rows = [r for r in report["rows"] if r["mixer"] == mixer and "ms" in r]
        color = f"C{i}"
        for ax, key in zip(axes, ("ms", "tokens_per_s", "peak_gib")):
            known = [r for r in rows if r[key] is not None]  # no peak on the CPU
            ax.plot([r["seq_len"] for r in known], [r[key] for r in known], "-", color=color, label=mixer)
            for r in known:
                ax.plot(r["seq_len"], r[key], "o", color=color,
                        markerfacecolor="none" if r["gradient_checkpointing"] else color)
    windows = sorted({r["tokens"] for r in report["rows"] if r["context"] != WHOLE})
    per_step = f"{windows[0]:,} tokens a step" if len(windows) == 1 else "tokens a step vary" if windows else ""
    axes[0].set(yscale="log", ylabel="ms per training step",
                title=f"training step, bf16 + AdamW ({per_step + '; ' if per_step else ''}whole: 1 chromosome)")
    axes[1].set(yscale="log", ylabel="tokens per second", title="throughput")
    axes[2].set(ylabel="peak GiB", title="peak memory of the step (hollow: checkpointed)")
    for ax in axes:
        ax.set(xscale="log", xlabel="sequence length (tokens; the last: the longest chromosome)")
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.suptitle(f"{report['shape']['task']} models on {report['shape']['fasta']}: {title_stamp(report['metadata'])}")
    save_figure(fig, path)
