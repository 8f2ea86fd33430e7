"""The project's promises about itself: CI runs exactly the README's test command."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands():
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines == [test_command]


def test_readme_has_exactly_two_setup_commands():
    setup = [c for c in readme_commands() if c.startswith("python3 -m venv")]
    assert len(setup) == 2 and any(c.endswith("genoflash demo") for c in setup)  # the main job is the demo


def test_readme_signatures_match_the_functions():
    """The README documents each public function's full signature; it must not drift from the code."""
    import inspect

    import genoflash

    text = (ROOT / "README.md").read_text()
    for fn in (genoflash.flash_attn_func, genoflash.flash_attn_varlen_func, genoflash.flash_attn_with_kvcache,
               genoflash.apply_rotary_emb):
        documented = re.search(rf"`{fn.__name__}\((.*?)\)`", text).group(1)
        parts = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.KEYWORD_ONLY and "*" not in parts:
                parts.append("*")
            parts.append(p.name + (f"={p.default!r}" if p.default is not p.empty else ""))
        actual = ", ".join(parts)
        assert documented == actual, f"README: {documented}\ncode:   {actual}"


STUB_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 in tools/gpu_tests.sh: the environment report, pip, and pytest, whose
# arguments and CUDA_VISIBLE_DEVICES it prints; it fails when asked to run the masking tests, and
# the run of the whole_gpu tests exits with $STUB_WHOLE_GPU_STATUS where that is set.
if [[ "$1" == "-" ]]; then cat > /dev/null; echo "device stub"; exit 0; fi
if [[ "$1 $2" == "-m pip" ]]; then exit 0; fi  # device_env.sh installing carried wheels, where there are any
if [[ "$1 $2" == "-m pytest" ]]; then
    echo "pytest on $CUDA_VISIBLE_DEVICES: ${*:3}"
    if [[ "$*" == *"-m whole_gpu"* && -n "$STUB_WHOLE_GPU_STATUS" ]]; then exit "$STUB_WHOLE_GPU_STATUS"; fi
    if [[ "$*" == *tests/ops/attention/test_masking.py* ]]; then echo "1 failed, 2 passed"; exit 1; fi
    echo "3 passed"; exit 0
fi
exit 2
"""


def _run_gpu_script(tmp_path, env_extra, *args):
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STUB_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "missing" / "out"  # a folder that does not exist yet: the script makes it
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out), **env_extra}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_tests.sh"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    return proc, out


def test_gpu_script_runs_pytest_into_a_new_out_folder(tmp_path):
    """The first call of 2026-11-30 ran no test: OUT did not exist and tee ended the script."""
    proc, out = _run_gpu_script(tmp_path, {}, "tests/ops/attention/test_attention.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pytest on" in (out / "gpu_tests.log").read_text() and "3 passed" in proc.stdout


@pytest.mark.parametrize("status,want", [(5, 0), (1, 1), (0, 0)], ids=["none-marked", "failed", "passed"])
def test_gpu_script_runs_the_whole_gpu_tests_after_the_rest(tmp_path, status, want):
    """The tests marked whole_gpu run in a second pytest, without workers; a failure there fails the
    script, and a selection with none of them (pytest's status 5) does not."""
    proc, out = _run_gpu_script(tmp_path, {"STUB_WHOLE_GPU_STATUS": str(status)}, "tests/ops/attention")
    assert proc.returncode == want, proc.stdout + proc.stderr
    runs = [line for line in (out / "gpu_tests.log").read_text().splitlines() if line.startswith("pytest on")]
    assert len(runs) == 2 and "-m not whole_gpu" in runs[0] and "-n" in runs[0]
    assert "-m whole_gpu" in runs[1] and "-n" not in runs[1].split()


def test_gpu_script_split_runs_every_file_once_and_fails_with_either_half(tmp_path):
    proc, out = _run_gpu_script(tmp_path, {"GENOFLASH_GPU_SPLIT": "2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the second half's stub pytest failed
    first, second = ((out / half / "gpu_tests.log").read_text() for half in ("gpu0", "gpu1"))
    assert "pytest on 0,1:" in first and "pytest on 1:" in second
    assert "3 passed" in proc.stdout and "1 failed" in proc.stdout
    # Each half runs its files twice: the tests not marked whole_gpu on its workers, then the rest.
    halves = [set(re.findall(r"tests/[\w/]*test_\w+\.py", log)) for log in (first, second)]
    for log in (first, second):
        assert log.count("-m not whole_gpu") == 1 and log.count("-m whole_gpu") == 1
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert not halves[0] & halves[1] and sorted(halves[0] | halves[1]) == files  # each file in one half


# Which packages each package of genoflash may import (its own modules always): the layering in
# DEVELOPERS.md. The top-level modules settings, backends, extras and padding are below everything.
BASE = {"genoflash.settings", "genoflash.backends", "genoflash.extras", "genoflash.padding"}
MAY_IMPORT = {
    "data": set(),
    "ops": set(),
    "layers": {"ops"},
    "models": {"layers", "ops", "data"},
    "distributed": {"ops", "layers", "models", "data"},
    "integrations": {"ops"},
    "train": {"ops", "layers", "models", "data", "distributed"},
    "inference": {"models", "data", "train"},
    "bench": {"ops", "layers", "models", "data", "distributed", "train", "api"},  # api: genoflash's public names
}


def _imports():
    """(module, imported module or package, imported name) for every `from ... import` in genoflash,
    function-level imports included."""
    import ast

    for path in sorted((ROOT / "genoflash").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts if parts[-1] == "__init__" else parts[:-1]
        package = [p for p in package if p != "__init__"]
        module = ".".join(p for p in parts if p != "__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("genoflash"):
                for alias in node.names:
                    yield module, target, alias.name


def _group(name: str) -> str:
    parts = name.split(".")
    return "base" if name in BASE or len(parts) < 2 else parts[1]


def test_packages_depend_only_downward_and_import_no_private_names_across_packages():
    wrong, private = [], []
    for module, target, name in _imports():
        src = _group(module)
        if target == "genoflash":  # `from genoflash import x`: a submodule, or a name of the public API
            dst = _group(f"genoflash.{name}") if (ROOT / "genoflash" / f"{name}.py").exists() or \
                (ROOT / "genoflash" / name).is_dir() else "api"
        else:
            dst = _group(target)
        if src in MAY_IMPORT and dst not in MAY_IMPORT[src] | {src, "base"}:
            wrong.append(f"{module} imports {target}.{name}")
        # a private (_name) import from outside the module's own package (e.g. ops.rotary taking
        # one of ops.attention's): Triton helpers are shared as _names within their operator's folder
        if name.startswith("_") and not name.startswith("__") and not target.startswith(module.rsplit(".", 1)[0]):
            private.append(f"{module} imports {target}.{name}")
    assert not wrong, "imports that run upward:\n" + "\n".join(wrong)
    assert not private, "private names imported across packages:\n" + "\n".join(private)


def test_no_import_circle():
    graph: dict[str, set[str]] = {}
    modules = {".".join(p for p in path.relative_to(ROOT).with_suffix("").parts if p != "__init__")
               for path in (ROOT / "genoflash").rglob("*.py")}
    for module, target, name in _imports():
        dst = f"{target}.{name}" if f"{target}.{name}" in modules else target
        if dst in modules and dst != module:
            graph.setdefault(module, set()).add(dst)
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != 1, "import circle: " + " -> ".join(path[path.index(nxt):] + [nxt])
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
