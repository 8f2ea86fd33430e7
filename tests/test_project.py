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
    for fn in (genoflash.flash_attn_func, genoflash.flash_attn_varlen_func):
        documented = re.search(rf"`{fn.__name__}\((.*?)\)`", text).group(1)
        parts = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.KEYWORD_ONLY and "*" not in parts:
                parts.append("*")
            parts.append(p.name + (f"={p.default!r}" if p.default is not p.empty else ""))
        actual = ", ".join(parts)
        assert documented == actual, f"README: {documented}\ncode:   {actual}"
