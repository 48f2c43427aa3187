"""Class-space fusion and a fixed generic-sentence bank for the ConSE bridge, as one indexable dot product.

ConSE alone compares a query with a clip in the text model's space: cos(e_t, e_v), where e_t is the unit query
embedding and e_v the clip's unit ConSE embedding. Two corrections, each measured on real footage
(docs/benchmarks.md, "Search quality on real footage"), are added to that score:

* **class space**: the query is mapped onto the 1000 class texts, q_t = softmax(e_t · Cᵀ / τ_c), and compared
  with the clip's mean class distribution p̄_v (the classifier's, at the ConSE temperature), both L2-normalised:
  a query that names a class the classifier saw is matched on that class, not only on its neighbourhood in the
  sentence space;
* **hubness**: a clip close to every generic description ("a man is walking outside") is a hub that tops many
  unrelated queries; its score is lowered by β · b_v, b_v = the mean cosine of e_v with its κ nearest sentences of a
  fixed bank shipped with tvr (``data/query_bank_v1.txt``) — computed once per clip, never from the user's queries.

The fused score

    s(t, v) = (1 − w) · e_t · e_v + w · q̂_t · p̂_v − β · b_v

is a dot product of two vectors computed on each side alone:

    text:  [(1 − w) · e_t,  w · q̂_t,  1,  0]
    video: [e_v,  p̂_v,  −β · b_v,  β · √(1 − b_v²)]

The last coordinate gives every video vector the same length √(2 + β²) (e_v, p̂_v are unit, |b_v| ≤ 1), and every
text vector has length √((1 − w)² + w² + 1), so a cosine head (CLIP4Clip's mean pooling) ranks by s exactly:
its score is s divided by a constant. The vectors therefore go into a FAISS inner-product index as they are.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

#: the generic-sentence bank shipped with tvr; a new bank is a new file (v2, …), so that an index built with one
#: bank is never queried with another (the bank's embeddings are part of the model's weights and its stamp)
BANK_FILE = Path(__file__).resolve().parent / "data" / "query_bank_v1.txt"
#: extra coordinates of a fused vector after the text space and the class space: the bank term and the length pad
EXTRA_DIMS = 2


def read_bank(path: str | os.PathLike = "") -> list[str]:
    """The bank's sentences: one a line, blank lines and ``#`` comments skipped (``""`` = the shipped bank)."""
    source = Path(path) if path else BANK_FILE
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"model.two_tower.conse_bank: {source}: cannot read it ({exc})") from None
    sentences = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not sentences:
        raise ValueError(f"model.two_tower.conse_bank: {source}: has no sentences (one a line, # for comments)")
    return sentences


def bank_digest(sentences: list[str]) -> str:
    return hashlib.sha256("\n".join(sentences).encode()).hexdigest()


def fused_width(text_width: int, num_classes: int) -> int:
    return text_width + num_classes + EXTRA_DIMS


def unit_cosines(unit: Tensor, class_embeddings: Tensor) -> Tensor:
    """Cosines [n, C] of unit rows [n, W] with unit class rows [C, W], as 1 − ‖x − c‖² / 2, each pair computed on its
    own: a matrix product's kernel (and so the last bit of a row) depends on how many rows it multiplies, and a
    search query must score the same alone and in a server's micro-batch."""
    distances = torch.cdist(unit, class_embeddings, compute_mode="donot_use_mm_for_euclid_dist")
    return 1.0 - distances.square() / 2.0


def fuse_text(embedding: Tensor, class_embeddings: Tensor, weight: float, temperature: float) -> Tensor:
    """[n, W] text embeddings (any length) → [n, W + C + 2] fused text vectors (module docstring)."""
    unit = F.normalize(embedding.float(), dim=-1)
    classes = F.normalize(torch.softmax(unit_cosines(unit, class_embeddings) / temperature, dim=-1), dim=-1)
    one = torch.ones_like(unit[..., :1])
    return torch.cat([(1.0 - weight) * unit, weight * classes, one, torch.zeros_like(one)], dim=-1)


def hub_scores(clip_embeddings: Tensor, bank: Tensor | None, neighbours: int) -> Tensor:
    """b_v: the mean cosine of each unit clip embedding [..., W] with its ``neighbours`` nearest bank rows [B, W]
    (zeros without a bank)."""
    if bank is None or not len(bank):
        return clip_embeddings.new_zeros(clip_embeddings.shape[:-1])
    sims = clip_embeddings @ bank.t()
    return sims.topk(min(int(neighbours), bank.shape[0]), dim=-1).values.mean(dim=-1)


def fuse_video(
    clip_embeddings: Tensor, class_distributions: Tensor, bank: Tensor | None, bank_weight: float, neighbours: int
) -> Tensor:
    """Unit clip embeddings [..., W] and mean class distributions [..., C] → [..., W + C + 2] fused video vectors."""
    hub = hub_scores(clip_embeddings, bank, neighbours).unsqueeze(-1)
    pad = bank_weight * (1.0 - hub * hub).clamp_min(0.0).sqrt()
    return torch.cat([clip_embeddings, F.normalize(class_distributions, dim=-1), -bank_weight * hub, pad], dim=-1)
