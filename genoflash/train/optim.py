"""The optimizer's parameter groups: which parameters weight decay reaches."""

from __future__ import annotations

import torch


def no_decay_names(model: torch.nn.Module) -> set[str]:
    """Names of the parameters weight decay leaves alone: vectors (biases, norm gains, Hyena's sine
    frequencies) and those marked `_no_weight_decay` (Mamba's A_log and D, Hyena's implicit-filter
    MLP: each mixer's published recipe). Read before DDP or FSDP2 wraps the model, since FSDP2
    replaces the parameters (and their marks) with sharded ones of the same names."""
    return {name for name, param in model.named_parameters()
            if param.dim() < 2 or getattr(param, "_no_weight_decay", False)}


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay: set[str]) -> list[dict]:
    """Two AdamW groups over `model`'s trainable parameters (a tied parameter once): weight_decay
    for all but the `no_decay` names (`no_decay_names`), 0 for those. An empty group is left out."""
    decay, exempt = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (exempt if name in no_decay else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
