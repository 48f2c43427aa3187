"""Seeding every generator a run draws from (Python, NumPy, torch CPU and CUDA)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA). ``deterministic`` also pins cuDNN to deterministic kernels and
    turns off its autotuner, as the reference recipe does (spec §1.4: seed 42, cudnn deterministic)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
