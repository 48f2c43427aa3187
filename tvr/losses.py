"""The losses every method shares: CLIP's symmetric InfoNCE. A method's own losses live in its folder
(``tvr/methods/<method>/losses.py``), pure tensor functions like this one.

Layout convention: a logits / delta tensor has texts on rows (dim 0) and videos on columns (dim 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def symmetric_infonce(logits: Tensor) -> Tensor:
    """½·[CE over rows + CE over columns] with the diagonal as the positives (CLIP4Clip's CrossEn, spec §1.3).

    ``logits`` is [B, B] and already multiplied by the logit scale. Duplicate videos inside a batch count as
    negatives, as in the reference implementations.
    """
    if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"symmetric_infonce expects square [B, B] logits, got {tuple(logits.shape)}")
    targets = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets))
