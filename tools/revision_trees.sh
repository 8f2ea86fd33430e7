#!/usr/bin/env bash
# Copies of other revisions' code, for one device call to run them beside the working tree (A/B
# timings and GPU tests of experiment branches without a call per branch). Run here:
#
#   bash tools/revision_trees.sh persistent=exp/sm90-forward-persistent base=main
#
# writes .carry/revs/NAME/ for each NAME=REV: `git archive REV` of pyproject.toml (pytest's
# settings), genoflash/, tools/, tests/ and benchmarks/ (its results left out), and COMMIT (REV's
# full hash). .carry is git-ignored and carried (carry=[".whl", ".carry"]; each tree is ~2.5 MB of
# the 64 MiB a call carries). On the device:
#
#   cd .carry/revs/NAME && GENOFLASH_COMMIT=$(cat COMMIT) PYTHONPATH=$PWD:$PYTHONPATH python ...
#
# (device_env.sh, sourced from the repository root first, has installed the carried wheels; pytest
# run from inside the tree imports the tree's genoflash).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.carry/' .git/info/exclude || echo '/.carry/' >> .git/info/exclude
[[ $# -gt 0 ]] || { echo "usage: $0 NAME=REV [NAME=REV ...]" >&2; exit 2; }
for pair in "$@"; do
    name=${pair%%=*}
    rev=${pair#*=}
    if [[ -z "$name" || "$name" == "$pair" || ! "$name" =~ ^[A-Za-z0-9_.-]+$ ]]; then
        echo "$pair: give NAME=REV, NAME of letters, digits, '.', '_' or '-'" >&2
        exit 2
    fi
    commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "$rev: not a revision" >&2; exit 2; }
    dest=.carry/revs/$name
    rm -rf "$dest" && mkdir -p "$dest"
    git archive "$commit" pyproject.toml genoflash tools tests benchmarks ':(exclude)benchmarks/results' | tar -x -C "$dest"
    echo "$commit" > "$dest/COMMIT"
    echo "$name: $rev ($commit) -> $dest ($(du -sh "$dest" | cut -f1))"
done
