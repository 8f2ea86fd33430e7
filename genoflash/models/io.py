"""Save and load models as a directory: config.json (the config dataclass plus "model_type")
and model.safetensors (the weights; no pickle, so loading runs no code from the file)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import torch
from torch import nn

from ..extras import require
from .dna_lm import DNALM, DNALMConfig
from .enformer import Enformer, EnformerConfig

# model_type in config.json -> (config class, model class)
MODEL_TYPES: dict[str, tuple[type, type[nn.Module]]] = {
    "dna_lm": (DNALMConfig, DNALM),
    "enformer": (EnformerConfig, Enformer),
}
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> pathlib.Path:
    """Write `model`'s config and weights into `directory` (created if missing); returns it."""
    model_type = next((name for name, (_, cls) in MODEL_TYPES.items() if type(model) is cls), None)
    if model_type is None:
        raise TypeError(f"save_pretrained takes one of {[cls.__name__ for _, cls in MODEL_TYPES.values()]}, "
                        f"got {type(model).__name__}")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, **dataclasses.asdict(model.config)}
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    safetensors = require("safetensors.torch", "train", "saving models")
    safetensors.save_model(model, str(directory / WEIGHTS_NAME))  # stores a tied embedding/head once
    return directory


def load_pretrained(directory: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """The model saved in `directory`, on `device`, in eval mode (as for inference)."""
    directory = pathlib.Path(directory)
    fields = json.loads((directory / CONFIG_NAME).read_text())
    model_type = fields.pop("model_type", None)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{directory / CONFIG_NAME}: model_type {model_type!r} is not one of {list(MODEL_TYPES)}")
    config_cls, model_cls = MODEL_TYPES[model_type]
    model = model_cls(config_cls(**fields)).to(device)
    # strict: a missing or unexpected tensor means the file does not match the config.
    safetensors = require("safetensors.torch", "train", "loading models")
    safetensors.load_model(model, str(directory / WEIGHTS_NAME), strict=True, device=str(device))
    return model.eval()
