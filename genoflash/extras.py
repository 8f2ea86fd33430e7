"""Optional dependencies, imported where they are used, with an error that says what to install.

The kernels need torch, triton and numpy only. The genomics stack, training, plots and the
transformers backend come with extras (pyproject.toml): `genoflash[genomics]` (pyfaidx),
`genoflash[bgzip]` (pyfaidx and Biopython, for bgzip-compressed FASTA), `genoflash[train]` (pyfaidx,
pyyaml, rich, matplotlib, safetensors), `genoflash[bench]` (matplotlib), `genoflash[transformers]`.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str, *, package: str | None = None) -> ModuleType:
    """import `module`, or raise an ImportError naming the extra that installs it.

    `package` is the name pip knows the distribution by, where it differs from the module's
    (Biopython installs `Bio`)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs {package or module.split('.')[0]}, which genoflash installs with "
                          f"its '{extra}' extra: pip install 'genoflash[{extra}]'") from error
