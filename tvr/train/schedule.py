"""Learning-rate multipliers (spec §1.4) and a LambdaLR builder.

A multiplier is a function of training progress ``x = step / t_total`` (``step`` counts optimizer steps from 0).
``LambdaLR`` multiplies every parameter group's *own* base lr by it, so the backbone group (lr × coef) follows the
same shape as the head group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("warmup_cosine", "constant")


def warmup_cosine(x: float, warmup: float = 0.1) -> float:
    """CLIP4Clip/BertAdam ``warmup_cosine``: ``x / warmup`` while ``x < warmup``, else ``½(1 + cos πx)``.

    The cosine is deliberately *not* re-based after warm-up (it is ``cos πx``, not ``cos π(x−w)/(1−w)``), so the
    multiplier jumps from 1 to ``½(1 + cos 0.1π) ≈ 0.976`` at ``x = warmup``, exactly like the reference.
    """
    if x < warmup:
        return x / warmup
    return 0.5 * (1.0 + math.cos(math.pi * x))


def constant(x: float, warmup: float = 0.0) -> float:
    """Multiplier 1 everywhere (``warmup`` is accepted and ignored so every schedule has one signature)."""
    return 1.0


_FUNCTIONS: dict[str, Callable[[float, float], float]] = {"warmup_cosine": warmup_cosine, "constant": constant}


def schedule_function(name: str) -> Callable[[float, float], float]:
    if name not in _FUNCTIONS:
        raise ValueError(f"train.schedule={name!r}: expected one of {list(SCHEDULES)}")
    return _FUNCTIONS[name]


def build_scheduler(optimizer: torch.optim.Optimizer, name: str, total_steps: int, warmup: float) -> LambdaLR:
    """A ``LambdaLR`` whose k-th optimizer step (k = 0, 1, …) uses ``lr · f(k / total_steps, warmup)``.

    As in the reference BertAdam, the very first step sees progress 0 (lr 0 under warm-up). Call
    ``scheduler.step()`` once after every ``optimizer.step()``. The multiplier is a closure, not a callable
    object, so ``state_dict`` stores only the step counter: resuming with the same config reproduces the run.
    """
    fn = schedule_function(name)
    # a parameter group may carry its own schedule (e.g. "constant"; see RetrievalHead.param_rules)
    group_fns = [schedule_function(group.get("schedule") or name) for group in optimizer.param_groups]
    if total_steps <= 0:
        raise ValueError(f"build_scheduler: total_steps must be positive, got {total_steps}")
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"train.warmup={warmup}: expected a fraction of training in [0, 1)")
    total = float(total_steps)

    def multiplier_of(function: Callable[[float, float], float]) -> Callable[[int], float]:
        def multiplier(step: int) -> float:
            return function(step / total, warmup)

        return multiplier

    if all(f is fn for f in group_fns):
        return LambdaLR(optimizer, multiplier_of(fn))
    return LambdaLR(optimizer, [multiplier_of(f) for f in group_fns])
