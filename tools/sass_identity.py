"""Compare the sm_90 machine code of two trees' kernels, without a GPU.

A change meant to keep the kernels as they are (Python moved between modules, a helper renamed, dead
constexpr branches deleted) should leave every kernel's SASS identical. This compiles the same cases
in both trees with each tree's own offline_compile.py (tools/, or benchmarks/ in older trees), writes
each kernel's SASS, and compares them file by file:

    git worktree add /tmp/before <commit>
    python tools/sass_identity.py /tmp/before . /tmp/sass [--cases plain-128,mamba-cf]

Each kernel is reported `identical`; `same code, other parameter offsets` (the instructions equal
once the constant-bank offsets of kernel parameters are masked: a parameter was added or removed);
`same code, registers renamed` (equal once register numbers are masked too: the same instructions
in the same order, allocated to other registers, as when the compiler meets its values in another
order); `differs`; or present in one tree only. The exit status is 0 when no kernel compiled in
both trees `differs`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

# name -> offline_compile.py arguments: every kernel family and feature path of the attention,
# rotary-free Mamba and Hyena-free code paths that offline_compile covers.
CASES = {
    "plain-128": "plain 128", "plain-128-causal": "plain 128 --causal", "plain-64": "plain 64",
    "plain-64-causal": "plain 64 --causal", "plain-256-causal": "plain 256 --causal", "plain-96": "plain 96",
    "plain-64-192": "plain 64 192", "plain-128-192-causal": "plain 128 192 --causal",
    "window-128": "window 128", "window-256": "window 256", "dropout-128": "dropout 128",
    "rope-128": "rope 128", "rope-bf16-128": "rope-bf16 128", "rope-64-32": "rope 64 --rotary-dim 32",
    "rope-dqtma-128": "rope 128 --dq-rope-tma", "softcap-alibi-128": "plain 128 --softcap 30 --alibi",
    "varlen-causal-128": "plain 128 --varlen --causal", "gqa-split-128": "plain 128 --gqa --heads-per-split 1 --causal",
    "sm90-128": "plain 128 --sm90-backward", "sm90-64-causal": "plain 64 --sm90-backward --causal",
    "sm90-256": "plain 256 --sm90-backward --causal", "keychunk-128": "plain 128 --key-chunk 512",
    "notma-128": "plain 128 --no-tma", "fp16-80": "plain 80 --dtype float16", "fp32-64": "plain 64 --dtype float32",
    "mamba-forward-cf": "mamba 16 --sequential-forward --channels-first",
    "mamba-forward-rows": "mamba 16 --sequential-forward", "mamba-cf": "mamba 16 --channels-first",
    "mamba-rows": "mamba 16", "sm90fwd-128-causal": "plain 128 --sm90-forward --causal",
    "sm90fwd-64-192-mods": "plain 64 192 --sm90-forward --softcap 5 --alibi",
    "sm90fwd-window-96-gqa": "window 96 --sm90-forward --gqa",
}
_PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")
_REGISTER = re.compile(r"\bU?R\d+\b")
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def compile_tree(tree: Path, case: str, args: str, out: Path) -> None:
    tool = next(p for p in (tree / "tools" / "offline_compile.py", tree / "benchmarks" / "offline_compile.py")
                if p.exists())
    target = out / case
    if target.exists():  # already compiled (a rerun)
        return
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("TRITON_INTERPRET", None)
    log = subprocess.run([sys.executable, str(tool), *args.split(), "--sass", str(target)], cwd=tree, env=env,
                         capture_output=True, text=True)
    (out / f"{case}.log").write_text(log.stdout + log.stderr)


def instructions(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if re.match(r"^\s+/\*[0-9a-f]{4,}\*/", line)]


def _masked(code: tuple[str, ...], registers: bool = False) -> tuple[str, ...]:
    masked = (_PARAM.sub("c[param]", _ADDRESS.sub("", x)) for x in code)
    return tuple(_REGISTER.sub("R", x) for x in masked) if registers else tuple(masked)


def compare(before: list[Path], after: list[Path]) -> str:
    """Compare the distinct builds of one kernel in each tree (a case may launch a kernel several
    times, e.g. the carry walk in the forward and the backward; offline_compile numbers the files
    in launch order, which may differ between trees)."""
    a = {tuple(instructions(p)) for p in before}
    b = {tuple(instructions(p)) for p in after}
    if a == b:
        return "identical"
    if {_masked(x) for x in a} == {_masked(x) for x in b}:
        return "same code, other parameter offsets"
    if {_masked(x, registers=True) for x in a} == {_masked(x, registers=True) for x in b}:
        return "same code, registers renamed"
    return f"differs ({sorted(len(x) for x in a)} -> {sorted(len(x) for x in b)} instructions)"


def _kernel(path: Path) -> str:
    """The kernel's name: the file's stem without offline_compile's launch number (-2, -3, ...)."""
    return re.sub(r"-\d+$", "", path.stem)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", help="comma-separated names of CASES (default: all)")
    args = parser.parse_args(argv)
    cases = CASES if not args.cases else {name: CASES[name] for name in args.cases.split(",")}
    ok = True
    for side, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
        (args.out / side).mkdir(parents=True, exist_ok=True)
        for case, case_args in cases.items():
            compile_tree(tree, case, case_args, args.out / side)
    for case in cases:
        before, after = args.out / "before" / case, args.out / "after" / case
        files = {side: {} for side in ("before", "after")}
        for side, folder in (("before", before), ("after", after)):
            for path in sorted(folder.glob("*.sass")):
                files[side].setdefault(_kernel(path), []).append(path)
        names = sorted(files["before"].keys() | files["after"].keys())
        if not names:
            print(f"{case}: no kernel compiled (see {args.out}/before/{case}.log and after/{case}.log)")
            ok = False
        for name in names:
            if name not in files["before"] or name not in files["after"]:
                print(f"{case} {name}: {'after' if name in files['after'] else 'before'} only")
                continue
            verdict = compare(files["before"][name], files["after"][name])
            ok &= not verdict.startswith("differs")
            print(f"{case} {name}: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
