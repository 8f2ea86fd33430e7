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
    assert len(setup) == 2 and any("genoflash example" in c for c in setup)
