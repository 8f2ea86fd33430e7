"""The project's promises about itself: CI runs exactly the README's test command."""

import pathlib
import re

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
    for fn in (genoflash.flash_attn_func, genoflash.flash_attn_varlen_func, genoflash.apply_rotary_emb):
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
# arguments and CUDA_VISIBLE_DEVICES it prints; it fails when asked to run the masking tests.
if [[ "$1" == "-" ]]; then cat > /dev/null; echo "device stub"; exit 0; fi
if [[ "$1 $2" == "-m pip" ]]; then exit 0; fi  # device_env.sh installing carried wheels, where there are any
if [[ "$1 $2" == "-m pytest" ]]; then
    echo "pytest on $CUDA_VISIBLE_DEVICES: ${*:3}"
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


def test_gpu_script_split_runs_every_file_once_and_fails_with_either_half(tmp_path):
    proc, out = _run_gpu_script(tmp_path, {"GENOFLASH_GPU_SPLIT": "2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the second half's stub pytest failed
    first, second = ((out / half / "gpu_tests.log").read_text() for half in ("gpu0", "gpu1"))
    assert "pytest on 0,1:" in first and "pytest on 1:" in second
    assert "3 passed" in proc.stdout and "1 failed" in proc.stdout
    ran = re.findall(r"tests/[\w/]*test_\w+\.py", first + second)
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert sorted(ran) == files  # each test file in exactly one half
