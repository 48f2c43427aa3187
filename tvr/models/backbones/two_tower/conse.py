"""ConSE: zero-shot image embeddings from an ImageNet classifier and a text encoder, without training.

Norouzi et al. 2014, "Zero-Shot Learning by Convex Combination of Semantic Embeddings": an image x with class
probabilities p(y|x) is mapped to

    f(x) = 1/Z · Σ_{t=1..T} p(ŷ_t | x) · s(ŷ_t),        Z = Σ_{t=1..T} p(ŷ_t | x),

where ŷ_1..ŷ_T are its T most probable classes and s(y) is the semantic (here: sentence) embedding of class y's name.
The image then lives in the text model's space and a caption is compared with it directly.

Class embeddings: each ImageNet class name (``data/imagenet_classes.txt``) is put in a prompt ("a photo of a {}.")
and embedded by the text tower; ``names: first`` embeds the first WordNet synonym, ``all`` averages the embeddings of
every synonym. Rows are L2-normalised. They are cached on disk per text model (``$TVR_CACHE_DIR`` or
``~/.cache/tvr``, ``conse/<key>.pt``; the key hashes the text tower's weights and tokenizer vocabulary, the prompt,
the names mode and the class file), so a later run of the same model reads 1000 × D floats instead of
encoding 1000 prompts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from tvr.utils.io import atomic_torch_save, cache_root  # noqa: F401 (cache_root: this module's API too)
from tvr.utils.torch_files import load_torch_file

log = logging.getLogger(__name__)

CLASS_FILE = Path(__file__).resolve().parent / "data" / "imagenet_classes.txt"
NUM_IMAGENET_CLASSES = 1000
#: bump when the way class embeddings are computed changes, so old cache files are not reused
_CACHE_VERSION = 1


def imagenet_class_names(path: str | os.PathLike = CLASS_FILE) -> list[list[str]]:
    """The 1000 classes, each as its list of synonyms (first = most common), in class-index order."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    classes = [
        [name.strip() for name in line.split(",") if name.strip()]
        for line in lines
        if line and not line.startswith("#")
    ]
    if len(classes) != NUM_IMAGENET_CLASSES or not all(classes):
        raise ValueError(f"{path}: expected {NUM_IMAGENET_CLASSES} non-empty class lines, got {len(classes)}")
    return classes


def class_prompts(classes: list[list[str]], prompt: str, names: str) -> tuple[list[str], Tensor]:
    """(prompts, owner): the texts to embed and the class index of each (``names``: first | all)."""
    if names not in ("first", "all"):
        raise ValueError(f"names = {names!r}: expected 'first' or 'all'")
    texts, owner = [], []
    for k, synonyms in enumerate(classes):
        for name in synonyms[:1] if names == "first" else synonyms:
            texts.append(prompt.replace("{}", name))
            owner.append(k)
    return texts, torch.tensor(owner, dtype=torch.long)


def pool_class_embeddings(embeddings: Tensor, owner: Tensor, num_classes: int) -> Tensor:
    """Mean of each class's prompt embeddings (each L2-normalised first), L2-normalised: [num_classes, D]."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    sums = torch.zeros(num_classes, unit.shape[1]).index_add_(0, owner, unit)
    counts = torch.bincount(owner, minlength=num_classes).clamp_min(1).unsqueeze(1).float()
    return torch.nn.functional.normalize(sums / counts, dim=-1)


def conse_combine(probs: Tensor, class_embeddings: Tensor, top_k: int) -> Tensor:
    """ConSE embedding of every row of ``probs`` [..., C]: the top-k classes' embeddings weighted by their
    probabilities renormalised to sum to one. ``class_embeddings`` [C, D] → [..., D]."""
    k = min(int(top_k), probs.shape[-1])
    top_p, top_i = probs.topk(k, dim=-1)
    weights = top_p / top_p.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.einsum("...k,...kd->...d", weights, class_embeddings[top_i])


def weights_fingerprint(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes and bytes): the identity of the weights themselves,
    whatever folder or seed they came from (MiniLM-L6: about 90 MB, a fraction of a second)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def embedding_cache_key(**fields: str) -> str:
    """The cache file name of text embeddings computed from ``fields`` (the text weights, its vocabulary and what
    was embedded)."""
    blob = json.dumps({"version": _CACHE_VERSION, **fields}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def class_embedding_cache_key(weights: str, tokenizer: str, prompt: str, names: str) -> str:
    classes = hashlib.sha256(CLASS_FILE.read_bytes()).hexdigest()
    return embedding_cache_key(weights=weights, tokenizer=tokenizer, prompt=prompt, names=names, classes=classes)


def read_cached_embeddings(path: Path, width: int, rows: int = NUM_IMAGENET_CLASSES) -> Tensor | None:
    """The cached embeddings at ``path`` when readable and of shape [rows, width], else None (recompute)."""
    if not path.is_file():
        return None
    try:
        value = load_torch_file(path)
    except Exception as exc:  # noqa: BLE001 - a damaged cache entry is recomputed, never fatal
        log.warning("ConSE embedding cache %s is unreadable (%s); recomputing it", path, exc)
        return None
    if not isinstance(value, Tensor) or tuple(value.shape) != (rows, width):
        log.warning("ConSE embedding cache %s has an unexpected shape; recomputing it", path)
        return None
    return value.float()


def write_cached_embeddings(path: Path, value: Tensor) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(value.float().contiguous(), path)
    except OSError as exc:  # a read-only home is no reason to fail: the embeddings are recomputed next time
        log.warning("could not write the ConSE class-embedding cache %s (%s)", path, exc)
