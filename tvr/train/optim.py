"""Optimizer construction (spec §1.4).

The reference uses BertAdam (pytorch-pretrained-bert): Adam moments with *decoupled* weight decay
(``p -= lr · (m / (√v + ε) + wd · p)``) and **no bias correction**. We use ``torch.optim.AdamW``, which has the same
decoupled decay but does correct the moment biases; the two differ only in the size of the first few hundred updates
(bias correction makes early updates larger while warm-up keeps the lr small, so the effect is minor). The reference
also clips each parameter's gradient inside BertAdam on top of the global clip; we apply the global clip only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tvr.config import TrainConfig

#: keys of ``RetrievalModel.parameter_groups`` that AdamW does not need; kept on the optimizer for logging
_META_KEYS = ("names", "group")


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``model.parameter_groups(lr, backbone_lr_coef, weight_decay)`` with betas/eps from ``cfg``.

    Group names (e.g. ``head``, ``head-nodecay``, ``backbone``) and the parameter names of every group are kept
    as ``optimizer.tvr_group_names`` / ``optimizer.tvr_param_names`` (same order as ``optimizer.param_groups``).
    """
    if not hasattr(model, "parameter_groups"):
        raise TypeError(f"{type(model).__name__} has no parameter_groups(lr, backbone_lr_coef, weight_decay)")
    groups = model.parameter_groups(cfg.lr, cfg.backbone_lr_coef, cfg.weight_decay)
    if not groups:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    clean: list[dict[str, Any]] = []
    group_names: list[str] = []
    param_names: list[list[str]] = []
    for k, group in enumerate(groups):
        group_names.append(str(group.get("group", f"group{k}")))
        param_names.append(list(group.get("names", [])))
        clean.append({key: value for key, value in group.items() if key not in _META_KEYS})
    if len(set(group_names)) != len(group_names):
        raise ValueError(f"parameter group names must be unique, got {group_names}")
    optimizer = torch.optim.AdamW(clean, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    optimizer.tvr_group_names = group_names  # type: ignore[attr-defined]
    optimizer.tvr_param_names = param_names  # type: ignore[attr-defined]
    return optimizer


def group_names(optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameter groups (``group0``, ``group1``… for optimizers not built here)."""
    names = getattr(optimizer, "tvr_group_names", None)
    if names is None or len(names) != len(optimizer.param_groups):
        return [f"group{k}" for k in range(len(optimizer.param_groups))]
    return list(names)


def current_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """``{group name: current lr}``, for the training log."""
    names = group_names(optimizer)
    return {name: float(group["lr"]) for name, group in zip(names, optimizer.param_groups, strict=True)}
