#!/usr/bin/env bash
# The length-extrapolation measurement (docs/design/decoding.md, "RoPE past the training length"),
# in one GPU call of about 3 minutes on an H100: a DNA LM trained at 4,096 bases, evaluated at up to 262,144
# with plain RoPE, position interpolation and NTK scaling.
#   yeast: trained on 14 of the 16 chromosomes, scored on the held-out chrXV and chrXVI;
#   chloroplast: trained on its first 80% (123,582 bp), scored on bases of the last 20%.
# Needs ../shared/data (carried as .carry/shared-data by tools/device_carry.sh). Results go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source tools/device_env.sh
out=${OUT:-benchmarks/results}
work=$(mktemp -d)
python3 - "$work" <<'PY'
import sys
import pyfaidx
work = sys.argv[1]
yeast = pyfaidx.Fasta("../shared/data/sacCer_S288C.fa", as_raw=True)
with open(f"{work}/yeast_train.fa", "w") as f:
    for name in yeast.keys():
        if name not in ("chrXV", "chrXVI"):
            f.write(f">{name}\n{yeast[name][:]}\n")
plastid = pyfaidx.Fasta("../shared/data/NC_000932.arabidopsis_chloroplast.fa", as_raw=True)
name = next(iter(plastid.keys()))
seq = str(plastid[name][:])
with open(f"{work}/chloroplast_train.fa", "w") as f:
    f.write(f">{name}_first80\n{seq[:len(seq) * 4 // 5]}\n")
PY
G="python3 -m genoflash.cli"
model=(--task lm --dim 256 --depth 4 --nheads 4 --seq-len 4096 --batch-size 16 --lr 0.002 --warmup-steps 50
       --eval-every 0 --checkpoint-every 100 --no-progress)
# A kill by timeout leaves the last checkpoint, which the evaluation loads.
timeout 200 $G train "${model[@]}" --fasta "$work/yeast_train.fa" --steps 3000 --out-dir "$work/yeast" \
    > "$out/extrapolation-yeast-train.log" 2>&1 || echo "yeast training ended with $?"
timeout 60 $G train "${model[@]}" --fasta "$work/chloroplast_train.fa" --steps 200 --out-dir "$work/chloroplast" \
    > "$out/extrapolation-chloroplast-train.log" 2>&1 || echo "chloroplast training ended with $?"
mkdir -p "$work/runs"
for run in yeast chloroplast; do  # the runs' settings and per-step logs, beside the results
    cp "$work/$run/config.yaml" "$work/runs/extrapolation-$run-config.yaml"
    # every 100th step and the evaluations (the whole log is thousands of lines)
    python3 -c "import json,sys; [print(l, end='') for l in open(sys.argv[1]) if 'eval' in l or json.loads(l).get('step', 1) % 100 == 0]" \
        "$work/$run/log.jsonl" > "$work/runs/extrapolation-$run-log.jsonl"
    mv "$out/extrapolation-$run-train.log" "$work/runs/"
done
# One archive for the runs' files: the device tool returns only a few files per call, and the
# results (two JSON files and two plots) must be among them.
tar czf "$out/extrapolation-runs.tgz" -C "$work/runs" .
$G bench extrapolation --model "$work/yeast" --fasta ../shared/data/sacCer_S288C.fa --records chrXV,chrXVI \
    --contexts 4096,16384,65536,262144 --target 4000 --per-record 8 --tag yeast --out "$out"
$G bench extrapolation --model "$work/chloroplast" --fasta ../shared/data/NC_000932.arabidopsis_chloroplast.fa \
    --contexts 4096,16384,65536,150000 --target 4000 --per-record 1 --tag chloroplast --out "$out"
