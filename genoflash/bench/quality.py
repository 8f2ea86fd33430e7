"""`genoflash bench quality`: held-out accuracy against distance, from demo runs at several lengths.

The mixer comparison asks which model connects two elements as they move apart. Each run
directory is what `genoflash demo --mixers G,L,H,M --out-dir DIR ...` wrote at one length
(`tools/gpu_quality_ladder.sh` makes them); this collects their `summary.json` files into one
table (a row per distance and seed, a column per model) and one plot: final accuracy against
distance (each seed a point, the line through their mean) and, beside it, each model's held-out
accuracy against the step (its `log.jsonl`), which tells "never learns" from "learns late".
A `genoflash train --task synthetic` run directory counts too: one model trained with its own
recipe (e.g. a paper's depth and learning-rate schedule), named by that recipe.
Only what the runs measured goes in: a model missing at a distance is left blank.

    genoflash bench quality RUN_DIR [RUN_DIR ...] [--out benchmarks/results] [--device "NVIDIA H200"]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..train.demo import MODELS
from ..train.trainer import LOG_NAME
from .common import RESULTS_DIR, device_name, pyplot, results_stem, run_metadata, save_figure, write_json

# Per-model fields copied from each run's summary, and the run config fields that say what was trained.
MODEL_FIELDS = ("accuracy", "auroc", "seconds", "layer_pattern")
# The demo writes each model's log under a folder named by its layer letter.
RUN_FOLDERS = {letter: folder for letter, (_, folder) in MODELS.items()}
CONFIG_FIELDS = ("seq_len", "distance", "sites", "spacer", "steps", "batch_size", "grad_accum", "lr", "dim", "depth",
                 "window_size", "seed", "device")


def collect(run_dirs: list[Path]) -> list[dict]:
    """One record per task and budget, sorted by distance: the config fields, the run
    directories and {model: fields}. Runs of the same task, budget and learning rate whose models were
    trained apart (e.g. on two GPUs, or in two device calls) are merged into one record."""
    merged: dict[tuple, dict] = {}
    for run_dir in run_dirs:
        path = Path(run_dir) / "summary.json"
        if not path.is_file() and (Path(run_dir) / "config.yaml").is_file():
            summary = train_summary(Path(run_dir))
        elif not path.is_file():
            raise FileNotFoundError(f"{path} is missing: is {run_dir} the --out-dir of a finished `genoflash demo` "
                                    "(or of a `genoflash train --task synthetic`, with its config.yaml)?")
        else:
            summary = json.loads(path.read_text())
        if "config" not in summary:
            raise ValueError(f"{path} has no 'config': not a genoflash demo summary")
        config = summary.pop("config")
        key = tuple(config.get(k) for k in CONFIG_FIELDS if k != "device")
        record = merged.setdefault(key, {"runs": [], **{k: config.get(k) for k in CONFIG_FIELDS}, "models": {}})
        record["runs"].append(str(run_dir))
        for name, rec in summary.items():
            if name in record["models"]:
                raise ValueError(f"{name} at distance {config.get('distance')} appears in more than one run "
                                 f"({', '.join(record['runs'])}): keep one")
            record["models"][name] = {k: rec.get(k) for k in MODEL_FIELDS}
            if "recipe" in rec:  # a `genoflash train` run with its own recipe
                record["models"][name]["recipe"] = rec["recipe"]
            curve = rec.pop("curve", None) or eval_curve(
                Path(run_dir) / RUN_FOLDERS.get(rec.get("layer_pattern"), "-") / LOG_NAME)
            if curve:
                record["models"][name]["curve"] = curve
    return sorted(merged.values(), key=lambda r: (r["distance"], r["seq_len"], -(r["lr"] or 0), str(r.get("seed"))))


def train_summary(run_dir: Path) -> dict:
    """A `genoflash train --task synthetic` run as a demo summary of one model. A model trained with
    its own recipe (depth, feed-forward, learning rate and schedule) is named by it, and its record
    leaves lr and depth blank, so it is a row of its own beside the demo's shared-recipe models."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    if config.get("task") != "synthetic":
        raise ValueError(f"{run_dir}: a genoflash train run of task {config.get('task')!r}, not 'synthetic'")
    evals = evaluations(run_dir / LOG_NAME)
    curve = accuracy_curve(evals)
    if not curve or curve[-1][0] != config.get("steps"):
        raise ValueError(f"{run_dir}: no held-out evaluation at the last step ({config.get('steps')}); "
                         "is the run finished, with --eval-every dividing --steps?")
    pattern = str(config.get("layer_pattern", ""))
    letters = set(pattern)
    name = MODELS[pattern[0]][0] if len(letters) == 1 and pattern[0] in MODELS else f"layers {pattern}"
    schedule = f"lr {config['lr']:g}" + (f" to {config['min_lr']:g}" if config.get("min_lr") != config["lr"] else "")
    ffn = config.get("ffn_mult")
    recipe = f"{config.get('depth')} blocks{', no feed-forward' if ffn == 0 else ''}, {schedule}"
    model = {"accuracy": evals[-1][1]["accuracy"], "auroc": evals[-1][1].get("auroc"), "seconds": None,
             "layer_pattern": pattern[:1], "curve": curve, "recipe": recipe}
    return {f"{name} ({recipe})": model, "config": {**{k: config.get(k) for k in CONFIG_FIELDS}, "lr": None,
                                                     "depth": None}}


def evaluations(log: Path) -> list[tuple[int, dict]]:
    """[(step, held-out evaluation), ...] from a run's log.jsonl (empty where there is none)."""
    if not log.is_file():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [(e["step"], e["eval"]) for e in entries if isinstance(e.get("eval"), dict) and "accuracy" in e["eval"]]


def accuracy_curve(evals: list[tuple[int, dict]]) -> list[list[float]]:
    """[[step, held-out accuracy], ...] from evaluations()."""
    return [[step, e["accuracy"]] for step, e in evals]


def eval_curve(log: Path) -> list[list[float]]:
    """[[step, held-out accuracy], ...] from a run's log.jsonl (empty where there is none)."""
    return accuracy_curve(evaluations(log))


def several_seeds(runs: list[dict]) -> bool:
    return len({r.get("seed") for r in runs}) > 1


def table(runs: list[dict]) -> str:
    """Markdown: held-out accuracy per distance (rows; a row per seed where the runs have several)
    and model (columns)."""
    models = list(dict.fromkeys(name for r in runs for name in r["models"]))
    seeds = several_seeds(runs)
    lines = ["| distance | length | steps x batch | lr | " + ("seed | " if seeds else "") + " | ".join(models) + " |",
             "|---" * (len(models) + 4 + seeds) + "|"]
    for r in runs:
        cells = [f"{r['models'][m]['accuracy']:.3f}" if m in r["models"] else "" for m in models]
        batch = r["batch_size"] * (r["grad_accum"] or 1)
        lr = "" if r["lr"] is None else f"{r['lr']:g}"
        lines.append(f"| {r['distance']:,} | {r['seq_len']:,} | {r['steps']} x {batch} | {lr} | "
                     + (f"{r.get('seed')} | " if seeds else "") + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    curves = any("curve" in m for r in runs for m in r["models"].values())
    fig, axes = pyplot().subplots(1, 2 if curves else 1, figsize=(13 if curves else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    # A line per (model, learning rate, step budget): runs at a second rate, or with more steps
    # than the shortest budget at their distance, are series of their own.
    several_lrs = len({r["lr"] for r in runs}) > 1
    fewest = {}
    for r in runs:
        fewest[r["distance"]] = min(fewest.get(r["distance"], r["steps"]), r["steps"])

    def series(r: dict, model: str) -> tuple:
        return model, r["lr"] if several_lrs else None, r["steps"] / fewest[r["distance"]]

    colours = {}
    for key in dict.fromkeys(series(r, name) for r in runs for name in r["models"]):
        model, lr, budget = key
        points = [(r["distance"], r["models"][model]["accuracy"]) for r in runs
                  if model in r["models"] and series(r, model) == key]
        distances = sorted({d for d, _ in points})
        # Each seed a point; the line joins the seeds' mean at each distance.
        mean = [sum(a for d, a in points if d == x) / sum(1 for d, _ in points if d == x) for x in distances]
        label = model + (f", lr {lr:g}" if lr is not None else "") + (f", {budget:g}x steps" if budget != 1 else "")
        line, = ax.plot(distances, mean, "s-", label=label + (" (seeds' mean)" if several_seeds(runs) else ""))
        ax.plot(*zip(*points), "o", color=line.get_color(), alpha=0.6)
        colours.setdefault(model, line.get_color())
    ax.axhline(0.5, color="grey", linestyle=":", label="chance")
    ax.set(xscale="log", xlabel="distance between the elements (bp)", ylabel="held-out accuracy", ylim=(0.3, 1.02),
           title="synthetic long-range task: final accuracy")
    ax.legend(fontsize=7, loc="center right")
    if curves:
        ax = axes[0][1]
        styles = ["-", "--", ":", "-."]
        seeds = sorted({r.get("seed") for r in runs}, key=str)
        for r in runs:
            for model, rec in r["models"].items():
                if "curve" in rec:
                    ax.plot(*zip(*rec["curve"]), marker="o", markersize=3, color=colours.get(model),
                            linestyle=styles[seeds.index(r.get("seed")) % len(styles)],
                            label=f"{model}, {r['distance']:,} bp, seed {r.get('seed')}")
        ax.axhline(0.5, color="grey", linestyle=":")
        ax.set(xlabel="step", ylabel="held-out accuracy", ylim=(0.3, 1.02), title="learning curves")
        ax.legend(fontsize=6, loc="center right", ncol=2 if len(runs) > 3 else 1)
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench quality", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="demo output directories (each with summary.json)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--device", help="the GPU the runs trained on (e.g. 'NVIDIA H200'), when merging "
                        "them elsewhere; it names the report. Default: this machine's")
    args = parser.parse_args(argv)
    runs = collect(args.runs)
    # The metadata's device names the report: run where the demos ran (the ladder script does),
    # or say which with --device. Each run also records its own ("cuda" or "cpu").
    metadata = run_metadata(method="held-out accuracy of `genoflash demo` runs (each run's seed in its record)")
    if args.device:
        metadata.update(device=args.device, merged_on=device_name())
    report = {"metadata": metadata, "runs": runs}
    stem = results_stem(args.out, report["metadata"], "quality")
    write_json(Path(f"{stem}.json"), report)
    plot(runs, Path(f"{stem}.png"))
    print(table(runs))
    print(f"wrote {stem}.json and {stem}.png")
    return 0
