"""Pretrained CLIP-family and SigLIP-family dual encoders from Hugging Face, used as they were trained (zero-shot).

``--model NAME_OR_DIR`` of ``tvr index`` names one: a preset (:data:`PRESETS`, e.g. ``clip-b32``), a hub id
(``openai/clip-vit-base-patch32``, ``google/siglip-base-patch16-224``), a local folder saved with
``save_pretrained``, or an OpenAI CLIP ``.pt`` (converted in memory by :mod:`tvr.models.backbones.clip.convert_openai`,
whose
tensors are read as data). What the folder's ``config.json`` says (``model_type``) decides the family, and the family
decides how text and images are fed to the model, as each was trained:

* **CLIP** (``clip``: ``CLIPModel``): the tokenizer's ids and attention mask, padded to any length up to the text
  context (77): the causal text tower pools at the end-of-text token, which sees nothing after it, so padding does
  not change a caption's features. Frames: the shorter side resized to the crop size, then a centre crop (CLIP's
  image processor).
* **SigLIP** (``siglip``: ``SiglipModel``, which also loads the fixed-resolution SigLIP 2 checkpoints, and
  ``siglip2``: ``Siglip2Model``, SigLIP 2's NaFlex variants): text padded to exactly the text context (64 tokens)
  and no attention mask, as big_vision trained it (the tower pools the last position, a padding token for short
  captions; HF's model card asks for ``padding="max_length"`` for that reason). Frames: squashed to a square
  (SigLIP's image processor resizes without cropping). A NaFlex model takes patches: each frame is squashed to the
  largest square its patch budget holds (256 patches of 16 px: 256 × 256) and cut into patches in the processor's
  layout; a square frame is what its own processor would make of a square image.

The tokenizer is the model's own, from the same folder or hub id; the pixel mean, standard deviation, crop size and
resize (crop or squash) are read from its ``preprocessor_config.json`` when it has one, and the family's published
values otherwise (a folder written by ``tvr convert-openai`` has none: CLIP's). Frames are resized with bicubic
interpolation (antialiased, as tvr resizes every frame), which both families' processors ask for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tvr.models.hub import hub_unreachable, offline_requested
from tvr.types import TextFeatures
from tvr.utils.data_files import parse_json, read_json
from tvr.utils.errors import UserError, first_line

log = logging.getLogger(__name__)

#: ``--model`` names for the common choices: (hub id, what it is). Sizes are the float32 weights on the hub.
PRESETS: dict[str, tuple[str, str]] = {
    "clip-b32": ("openai/clip-vit-base-patch32", "OpenAI CLIP ViT-B/32: 151 M parameters (605 MB), 512-d"),
    "clip-b16": ("openai/clip-vit-base-patch16", "OpenAI CLIP ViT-B/16: 150 M parameters (599 MB), 512-d"),
    "clip-l14": ("openai/clip-vit-large-patch14", "OpenAI CLIP ViT-L/14: 428 M parameters (1.71 GB), 768-d"),
    "siglip-base": ("google/siglip-base-patch16-224", "SigLIP B/16 at 224 px: 203 M parameters (813 MB), 768-d"),
    "siglip2-base": (
        "google/siglip2-base-patch16-224",
        "SigLIP 2 B/16 at 224 px, multilingual (Gemma vocabulary): 375 M parameters (1.5 GB), 768-d",
    ),
    "siglip-multilingual": (
        "google/siglip-base-patch16-256-multilingual",
        "SigLIP B/16 at 256 px, multilingual: 370 M parameters (1.48 GB), 768-d",
    ),
}

#: the families tvr feeds as trained, by ``config.json`` ``model_type``
FAMILIES = ("clip", "siglip", "siglip2")
#: CLIP's and SigLIP's published pixel statistics (used when a folder has no ``preprocessor_config.json``)
_CLIP_MEAN, _CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
_SIGLIP_MEAN = _SIGLIP_STD = (0.5, 0.5, 0.5)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: keys of a ``config.json`` that say where, how or by what a model was saved, not what it computes
_NOT_CONTENT = {
    "_name_or_path",
    "name_or_path",
    "transformers_version",
    "_commit_hash",
    "torch_dtype",
    "dtype",
    "architectures",
}


class DualEncoderError(UserError, ValueError):
    """``--model`` names nothing that loads as a CLIP- or SigLIP-family dual encoder."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a dual encoder comes from: ``kind`` (``folder``, ``hub`` or ``openai``) and ``location`` (an absolute
    folder or ``.pt`` path, or a hub id); ``name``: what the user wrote (a preset name, say)."""

    kind: str
    location: str
    name: str


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """How captions are fed: padded to ``max_length`` tokens at most (exactly, when ``fixed_length``), with the
    attention mask or without it."""

    max_length: int
    fixed_length: bool
    attention_mask: bool


@dataclasses.dataclass(frozen=True)
class ImageSettings:
    """How frames are fed: ``size`` pixels square, ``resize`` (``short_side``: resize + centre crop; ``square``:
    squash), normalised by ``mean`` / ``std``; ``patch`` > 0: cut into patches of that size (NaFlex)."""

    size: int
    resize: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    patch: int = 0


def resolve_source(spec: str) -> ModelSource:
    """What ``--model`` names, checked without loading anything: a preset, an existing folder (with a
    ``config.json``), an OpenAI ``.pt`` / ``.pth`` file, or a hub id."""
    text = str(spec).strip()
    if not text:
        raise DualEncoderError("--model is empty; expected a preset (" + ", ".join(PRESETS) + "), a folder or a hub id")
    if text in PRESETS:
        return ModelSource("hub", PRESETS[text][0], text)
    path = Path(os.path.expanduser(text))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DualEncoderError(
                f"--model {text}: the folder has no config.json, so it is not a model saved with save_pretrained; "
                "expected a CLIP or SigLIP folder, a hub id or a preset (" + ", ".join(PRESETS) + ")"
            )
        return ModelSource("folder", str(path.resolve()), text)
    if path.is_file():
        return ModelSource("openai", str(path.resolve()), text)
    if path.exists() or text.startswith(("/", ".", "~")) or not _HUB_ID.match(text):
        raise DualEncoderError(
            f"--model {text}: no such folder or file, and not a hub id (owner/name) or a preset ("
            + ", ".join(PRESETS)
            + ")"
        )
    return ModelSource("hub", text, text)


def _hub_kwargs(source: ModelSource) -> dict[str, Any]:
    """``from_pretrained`` arguments: a folder never reaches the network; a hub id is read from the local cache
    when it is there, and fetched only when the hub answers (offline it fails in seconds, saying what to do)."""
    if source.kind != "hub":
        return {"local_files_only": True}
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source.location, "config.json")
    if isinstance(cached, str):
        return {"local_files_only": True}
    advice = "download it once online (it is cached then), or give a local folder saved with save_pretrained"
    if offline_requested():
        raise DualEncoderError(
            f"--model {source.name}: hub model {source.location!r} is not in the local Hugging Face cache and "
            f"offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): {advice}"
        )
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise DualEncoderError(
            f"--model {source.name}: hub model {source.location!r} is not in the local Hugging Face cache and the "
            f"hub cannot be reached ({unreachable}): {advice}"
        )
    return {}


def read_model_type(source: ModelSource) -> str:
    """The ``model_type`` of a folder or hub model (its ``config.json``), refused unless it is a dual encoder tvr
    knows how to feed (:data:`FAMILIES`)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source.location, **_hub_kwargs(source))
    except DualEncoderError:
        raise
    except Exception as exc:  # noqa: BLE001 - a missing, damaged or unknown config.json raises many types
        raise DualEncoderError(
            f"--model {source.name}: its config.json does not load as a transformers model ({first_line(exc)})"
        ) from None
    model_type = str(getattr(config, "model_type", ""))
    if model_type not in FAMILIES:
        raise DualEncoderError(
            f"--model {source.name}: a {model_type or 'model of unknown type'} model (config.json model_type), not "
            f"a CLIP- or SigLIP-family dual encoder (model_type one of {', '.join(FAMILIES)})"
        )
    return model_type


class DualEncoder(nn.Module):
    """A transformers dual encoder with its tokenizer and how it is fed (:class:`TextSettings`,
    :class:`ImageSettings`). :meth:`encode_text` / :meth:`encode_frames` are the model's own
    ``get_text_features`` / ``get_image_features``, unnormalised."""

    def __init__(self, model: nn.Module, tokenizer: Any, family: str, text: TextSettings, image: ImageSettings) -> None:
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.family = family
        self.text = text
        self.image = image

    @property
    def embed_dim(self) -> int:
        config = self.model.config
        dim = getattr(config, "projection_dim", None)
        return int(dim if dim is not None else config.text_config.hidden_size)

    def encode_text(self, ids: Tensor, mask: Tensor) -> Tensor:
        """``get_text_features`` [n, D] of token ids and their attention mask [n, L]: the mask is passed to CLIP and
        not to SigLIP (as each was trained)."""
        kwargs = {"attention_mask": mask} if self.text.attention_mask else {}
        return _pooled(self.model.get_text_features(input_ids=ids, **kwargs))

    def text_features(self, batch: dict[str, Tensor]) -> TextFeatures:
        """:meth:`encode_text` as tvr's models answer (``text_ids`` / ``text_mask`` in, ``TextFeatures`` out): the
        text path the query export traces."""
        return TextFeatures(eot=self.encode_text(batch["text_ids"], batch["text_mask"]))

    def encode_frames(self, pixels: Tensor) -> Tensor:
        """``get_image_features`` [n, D] of normalised frames [n, 3, S, S]."""
        if not self.image.patch:
            return _pooled(self.model.get_image_features(pixel_values=pixels))
        n, channels, size, _ = pixels.shape
        p = self.image.patch
        side = size // p
        # the NaFlex processor's layout: [patch row, patch column, pixel row, pixel column, channel], flattened
        patches = pixels.reshape(n, channels, side, p, side, p).permute(0, 2, 4, 3, 5, 1).reshape(n, side * side, -1)
        mask = torch.ones(n, side * side, dtype=torch.long, device=pixels.device)
        shapes = torch.tensor([[side, side]] * n, dtype=torch.long, device=pixels.device)
        return _pooled(
            self.model.get_image_features(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)
        )

    def content_sha256(self) -> str:
        """A hash of what decides the embeddings: the model's config (minus where and by which version it was
        saved), every weight, the tokenizer's files (minus paths) and how text and frames are fed. A folder moved or
        copied elsewhere, or the same model from the hub cache, hashes the same."""
        config = {k: v for k, v in self.model.config.to_dict().items() if k not in _NOT_CONTENT}
        for side in ("text_config", "vision_config"):
            if isinstance(config.get(side), dict):
                config[side] = {k: v for k, v in config[side].items() if k not in _NOT_CONTENT}
        described = {
            "config": config,
            "text": dataclasses.asdict(self.text),
            "image": dataclasses.asdict(self.image),
            "tokenizer": tokenizer_sha256(self.tokenizer),
        }
        digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode())
        for name, tensor in sorted(self.model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return digest.hexdigest()


def _pooled(output: Any) -> Tensor:
    """transformers 5 returns the features as ``pooler_output``; 4.x returned the tensor itself."""
    return output if isinstance(output, Tensor) else output.pooler_output


def tokenizer_sha256(tokenizer: Any) -> str:
    """A hash of a tokenizer's files as ``save_pretrained`` writes them, without the paths a JSON file may record:
    the same vocabulary and settings hash the same wherever they were read from."""
    import tempfile

    digest = hashlib.sha256(type(tokenizer).__name__.encode())
    with tempfile.TemporaryDirectory(prefix="tvr-tokenizer-hash-") as folder:
        tokenizer.save_pretrained(folder)
        for path in sorted(Path(folder).iterdir()):
            data = path.read_bytes()
            if path.suffix == ".json":
                values = parse_json(data, path)
                if isinstance(values, dict):
                    values = {k: v for k, v in values.items() if k not in _NOT_CONTENT}
                data = json.dumps(values, sort_keys=True).encode()
            digest.update(path.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _preprocessor_values(source: ModelSource, hub: dict[str, Any]) -> dict[str, Any]:
    """The image processor's settings (``preprocessor_config.json``), {} when the model has none."""
    if source.kind == "openai":
        return {}
    from transformers.utils import cached_file

    try:
        path = cached_file(
            source.location, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False, **hub
        )
    except Exception:  # noqa: BLE001 - no processor file: the family's published settings
        return {}
    if not path:
        return {}
    try:
        values = read_json(path)
    except (OSError, ValueError) as exc:
        raise DualEncoderError(f"--model {source.name}: preprocessor_config.json does not read: {exc}") from None
    return values if isinstance(values, dict) else {}


def _square_side(value: Any) -> int | None:
    """A processor ``size`` / ``crop_size`` as one side: an int, ``{"shortest_edge"}`` or a square
    ``{"height", "width"}``."""
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if "shortest_edge" in value:
            return int(value["shortest_edge"])
        if value.get("height") is not None and value.get("height") == value.get("width"):
            return int(value["height"])
    return None


def image_settings(family: str, model: nn.Module, processor: dict[str, Any], where: str) -> ImageSettings:
    """How frames are fed to ``model`` (module docstring): the processor's settings over the family's defaults."""
    vision = model.config.vision_config
    clip_like = family == "clip"
    mean = tuple(float(v) for v in processor.get("image_mean") or (_CLIP_MEAN if clip_like else _SIGLIP_MEAN))
    std = tuple(float(v) for v in processor.get("image_std") or (_CLIP_STD if clip_like else _SIGLIP_STD))
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise DualEncoderError(f"{where}: preprocessor_config.json image_mean / image_std are not three values each")
    if family == "siglip2":  # NaFlex: the largest square of whole patches the patch budget holds
        patch = int(processor.get("patch_size") or vision.patch_size)
        budget = int(processor.get("max_num_patches") or 256)
        side = max(1, int(budget**0.5))
        while (side + 1) ** 2 <= budget:
            side += 1
        while side * side > budget:
            side -= 1
        return ImageSettings(side * patch, "square", mean, std, patch)
    crop = processor.get("do_center_crop", clip_like)
    size = _square_side(processor.get("crop_size") if crop else processor.get("size"))
    size = int(size or vision.image_size)
    resized = _square_side(processor.get("size")) if crop else None
    if resized is not None and resized != size:
        log.warning(
            "%s: its processor resizes the shorter side to %d and crops %d; tvr resizes it to %d and crops that (a "
            "slightly wider view than the model was trained on)",
            where,
            resized,
            size,
            size,
        )
    if size != int(vision.image_size):
        raise DualEncoderError(
            f"{where}: its processor makes {size}-pixel images but its vision tower takes {vision.image_size}"
        )
    return ImageSettings(size, "short_side" if crop else "square", mean, std)  # type: ignore[arg-type]


def text_settings(family: str, model: nn.Module) -> TextSettings:
    context = int(model.config.text_config.max_position_embeddings)
    if family == "clip":
        return TextSettings(context, fixed_length=False, attention_mask=True)
    return TextSettings(context, fixed_length=True, attention_mask=False)


def _openai_bpe(path: Path, name: str) -> Path:
    """CLIP's ``bpe_simple_vocab_16e6.txt.gz`` beside an OpenAI ``.pt`` (the file carries no tokenizer)."""
    bpe = path.parent / "bpe_simple_vocab_16e6.txt.gz"
    if not bpe.is_file():
        raise DualEncoderError(
            f"--model {name}: an OpenAI CLIP file carries no tokenizer, and there is no bpe_simple_vocab_16e6.txt.gz "
            f"beside it in {path.parent}: put CLIP's BPE file there, or convert it with `tvr convert-openai "
            f"{path.name} DIR --bpe bpe_simple_vocab_16e6.txt.gz` and give --model DIR"
        )
    return bpe


def _load_openai(source: ModelSource) -> DualEncoder:
    import tempfile

    from transformers import CLIPTokenizer

    from tvr.data.tokenizer import read_clip_merges, write_tokenizer_files
    from tvr.models.backbones.clip.convert_openai import load_openai_clip

    path = Path(source.location)
    bpe = _openai_bpe(path, source.name)
    model = load_openai_clip(path)
    with tempfile.TemporaryDirectory(prefix="tvr-clip-bpe-") as folder:
        write_tokenizer_files(folder, read_clip_merges(bpe))
        tokenizer = CLIPTokenizer.from_pretrained(folder, local_files_only=True)
    return DualEncoder(model, tokenizer, "clip", text_settings("clip", model), image_settings("clip", model, {}, ""))


def _check_tokenizer_libraries(family: str, name: str) -> None:
    """SigLIP's tokenizer is a SentencePiece model, which transformers reads with ``sentencepiece`` and ``protobuf``
    (both tvr dependencies): one missing is named here, not as transformers' ImportError."""
    if family != "siglip":
        return
    try:
        import google.protobuf  # noqa: F401
        import sentencepiece  # noqa: F401
    except ImportError as exc:
        raise DualEncoderError(
            f"--model {name}: SigLIP's tokenizer needs the {exc.name} package (pip install sentencepiece protobuf)"
        ) from None


def check_source(source: ModelSource) -> None:
    """What can be checked before the weights load: an OpenAI file has CLIP's BPE beside it; a folder or hub model
    is in reach and its ``config.json`` names a dual encoder."""
    if source.kind == "openai":
        _openai_bpe(Path(source.location), source.name)
    else:
        read_model_type(source)


def load_dual_encoder(source: ModelSource) -> DualEncoder:
    """Load the dual encoder ``source`` names (float32, eval mode) with its tokenizer; one line for anything that is
    not one (:class:`DualEncoderError`)."""
    if source.kind == "openai":
        return _load_openai(source)
    from transformers import AutoModel, AutoTokenizer

    from tvr.utils.pickle_scan import PickleRefusedError
    from tvr.utils.torch_files import TorchFileError, check_model_folder

    family = read_model_type(source)
    hub = _hub_kwargs(source)
    if source.kind == "folder":
        try:
            check_model_folder(source.location)  # transformers torch.loads a pytorch_model.bin itself: scanned first
        except (PickleRefusedError, TorchFileError) as exc:
            raise DualEncoderError(f"--model {source.name}: {exc}") from None
    try:
        model = AutoModel.from_pretrained(source.location, dtype=torch.float32, **hub)
    except Exception as exc:  # noqa: BLE001 - missing or truncated weights raise many types
        raise DualEncoderError(
            f"--model {source.name}: the weights do not load ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    if not (hasattr(model, "get_text_features") and hasattr(model, "get_image_features")):
        raise DualEncoderError(f"--model {source.name}: {type(model).__name__} has no text and image towers")
    _check_tokenizer_libraries(family, source.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.location, **hub)
    except Exception as exc:  # noqa: BLE001 - no tokenizer files, or a library it needs is missing
        raise DualEncoderError(
            f"--model {source.name}: its tokenizer does not load ({type(exc).__name__}: {first_line(exc)}); "
            "the tokenizer files (tokenizer.json, vocab.json + merges.txt or spiece.model) belong in the same "
            "folder as the weights (a CLIP folder: `tvr tokenizer bpe_simple_vocab_16e6.txt.gz FOLDER` writes "
            "them)"
        ) from None
    processor = _preprocessor_values(source, hub)
    model = model.float().eval()
    where = f"--model {source.name}"
    return DualEncoder(
        model, tokenizer, family, text_settings(family, model), image_settings(family, model, processor, where)
    )
