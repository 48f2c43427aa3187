"""The models a search index is built and queried with.

A :class:`SearchEncoder` turns caption strings into the head's text state and the uint8 frames of clip windows into
``VideoFeatures``; its :meth:`~SearchEncoder.stamp` identifies it (kind and a content hash), and an index refuses to
be queried by an encoder with another stamp. :class:`CheckpointEncoder` is any tvr checkpoint: the model, its head
and its frame settings come from the file alone (checkpoints carry their resolved config).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.models.heads.base import RetrievalHead
from tvr.search.stamps import EncoderMismatchError, check_stamp, describe_stamp  # noqa: F401 (this module's API too)
from tvr.search.windows import FrameSpec
from tvr.types import VideoFeatures
from tvr.utils.errors import UserError
from tvr.utils.io import file_sha256

#: token lengths shorter than ``data.max_words`` that a search query is padded to when it fits (MiniLM-L6 at 16
#: tokens costs half of 32; most queries are short)
QUERY_LENGTHS = (16,)


def padded_lengths(max_words: int) -> list[int]:
    """Every length a search pads queries to: :data:`QUERY_LENGTHS` below ``max_words``, and ``max_words``."""
    return sorted({n for n in QUERY_LENGTHS if n < max_words} | {max_words})


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Encode and score queries on one intra-op thread, restoring the caller's setting after. On several threads a
    matrix product shares its work out by the shape of the whole batch, so a query's features change in the last
    bits with the queries encoded beside it; on one they do not (``tests/test_search.py`` checks the real text
    model at every batch size a server forms), so a micro-batched query gets the answer it gets alone. One thread is
    also the faster for these small tensors on a busy machine: a 16-token MiniLM pass over 20 queries took 0.16 s
    of wall time on one thread and 0.48 s on two, at load average 3-4 on two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class SearchEncoder:
    """What indexing and querying need from a model (subclasses set ``head``, ``spec`` and ``device``)."""

    #: the method head: encodes states, shortlist embeddings, rerank states, exact scores
    head: RetrievalHead
    #: how one window is sampled and cropped (decoded in worker processes)
    spec: FrameSpec
    device: torch.device
    #: texts / windows per forward pass
    batch_size: int = 32
    #: the longest text in tokens (``data.max_words``): longer texts are truncated to it
    max_words: int
    #: whether it encodes video too (an exported query side does not: ranking captions then loads the full model)
    has_image_side: bool = True

    def stamp(self) -> dict[str, Any]:
        """Identity recorded in an index's manifest: ``encoder`` (kind), ``id`` (a content hash: two encoders with
        the same stamp embed identically) and descriptive fields."""
        raise NotImplementedError

    def token_ids(self, texts: list[str], length: int) -> tuple[Tensor, Tensor]:
        """Token ids and mask [n, length] of ``texts`` (padded to ``length``, truncated to it)."""
        raise NotImplementedError

    def text_features(self, texts: list[str], length: int | None = None) -> Any:
        """Backbone text features (``TextFeatures``) of caption strings, padded to ``length`` tokens (default
        ``max_words``)."""
        raise NotImplementedError

    def query_lengths(self, texts: list[str]) -> list[int]:
        """The length each query is padded to for search: the shortest of :data:`QUERY_LENGTHS` and ``max_words``
        that holds all its tokens. A text-encoder pass costs in proportion to the padded length, and a query's
        features at one length do not depend on the other queries encoded with it on one thread (the search index
        encodes on one; ``tests/test_search.py`` checks it), so queries grouped by length get the answers they get
        alone."""
        fits = self.padded_lengths()
        if len(fits) == 1:  # a model fed one length only (SigLIP): nothing to count
            return fits * len(texts)
        _, mask = self.token_ids(texts, self.max_words)
        return [next(n for n in fits if n >= count) for count in mask.sum(dim=1).tolist()]

    def padded_lengths(self) -> list[int]:
        """Every length this encoder pads queries to (:func:`padded_lengths` of ``max_words``; a model trained on
        one padded length only says so)."""
        return padded_lengths(self.max_words)

    def window_features(self, crops: Tensor, mask: Tensor) -> VideoFeatures:
        """``VideoFeatures`` (after any temporal module) of windows: ``crops`` uint8 [n, F, S, S, 3] as
        :func:`tvr.search.windows.crop_frames` makes them, ``mask`` [n, F] (0 = padding)."""
        raise NotImplementedError

    @torch.no_grad()
    def encode_texts(self, texts: list[str], length: int | None = None) -> Any:
        """The head's text state of ``texts`` (on the CPU, float32), padded to ``length`` tokens (default
        ``max_words``)."""
        if not texts:
            raise ValueError("encode_texts: no texts")
        parts = [
            self.text_features(texts[a : a + self.batch_size], length).to("cpu", torch.float32)
            for a in range(0, len(texts), self.batch_size)
        ]
        features = type(parts[0]).cat(parts) if len(parts) > 1 else parts[0]
        return self.head.encode_texts(features)

    @torch.no_grad()
    def encode_windows(self, crops: np.ndarray | Tensor, mask: np.ndarray | Tensor) -> VideoFeatures:
        """``window_features`` in batches of ``batch_size`` windows (on the CPU, float32). Each batch holds the windows
        of one video only, so a video's features never depend on which other videos were indexed with it."""
        crops, mask = torch.as_tensor(crops), torch.as_tensor(mask)
        parts = [
            self.window_features(crops[a : a + self.batch_size], mask[a : a + self.batch_size]).to("cpu", torch.float32)
            for a in range(0, crops.shape[0], self.batch_size)
        ]
        return VideoFeatures.cat(parts) if len(parts) > 1 else parts[0]

    def check_stamp(self, stamp: dict[str, Any], where: str) -> None:
        """Raise :class:`EncoderMismatchError` unless ``stamp`` (an index's) is this encoder's."""
        check_stamp(self.stamp(), stamp, where)


def _pixels(crops: Tensor, mask: Tensor, norm: Any = None) -> Tensor:
    """uint8 crops [n, F, S, S, 3] → normalised float [n, F, 3, S, S] with zeros on padding slots (as
    :func:`tvr.data.video.frames_to_clip` pads: zeros in the normalised space). ``norm``: the backbone's pixel
    normalisation (None: CLIP's)."""
    from tvr.data.transforms import normalize

    n, f, s = crops.shape[0], crops.shape[1], crops.shape[2]
    x = crops.reshape(n * f, s, s, 3).permute(0, 3, 1, 2).float().div_(255.0)
    x = (normalize(x) if norm is None else normalize(x, norm)).reshape(n, f, 3, s, s)
    return x * mask.to(x.dtype)[:, :, None, None, None]


def weights_sha256(model: torch.nn.Module, config: dict[str, Any]) -> str:
    """A content hash of a model: its resolved config and every tensor of its state dict (names, shapes, bytes)."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


class ModelEncoder(SearchEncoder):
    """A tvr ``RetrievalModel`` with the resolved run it was built from (:func:`tvr.models.run_spec.resolve_run`):
    frame settings, tokenizer and pixel normalisation follow it."""

    def __init__(
        self, model: torch.nn.Module, run: Any, device: str | torch.device = "cpu", batch_size: int = 32
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.run = run
        self.cfg = cfg = run.config
        self.head = self.model.head
        self.batch_size = batch_size
        from tvr.data.datasets import data_pixel_norm
        from tvr.data.transforms import SAMPLING_RESIZE

        data = cfg.data
        self.spec = FrameSpec(
            data.max_frames,
            data.frame_rate,
            data.image_size,
            data.sampling,
            SAMPLING_RESIZE[data.sampling],
        )
        self.norm = data_pixel_norm(data)
        self._tokenizer = None
        self._tokenizer_dir: tempfile.TemporaryDirectory | None = None
        self._tokenizer_lock = threading.Lock()  # built once, by the first of several querying threads

    def tokenizer(self):
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from tvr.data.tokenizer import build_tokenizer

                # a tiny model's tokenizer is built locally into a private folder (read-only index folders stay so)
                self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="tvr-tokenizer-")
                self._tokenizer = build_tokenizer(self.run.tokenizer, self._tokenizer_dir.name)
            return self._tokenizer

    @property
    def max_words(self) -> int:
        return int(self.cfg.data.max_words)

    def token_ids(self, texts: list[str], length: int) -> tuple[Tensor, Tensor]:
        return self.tokenizer()(texts, length)

    def text_features(self, texts: list[str], length: int | None = None) -> Any:
        ids, mask = self.token_ids(texts, length or self.max_words)
        return self.model.text_features({"text_ids": ids.to(self.device), "text_mask": mask.to(self.device)})

    def window_features(self, crops: Tensor, mask: Tensor) -> VideoFeatures:
        batch = {"video": _pixels(crops, mask, self.norm).to(self.device), "video_mask": mask.long().to(self.device)}
        return self.model.video_features(batch)

    def head_config(self) -> dict[str, Any]:
        """The head's config as plain values (the query export rebuilds the head from it)."""
        from tvr.config import config_to_dict

        return config_to_dict(self.cfg)["head"]


class CheckpointEncoder(ModelEncoder):
    """A tvr checkpoint (``tvr train`` / ``tvr import-checkpoint``): model, head and frame settings from the file."""

    def __init__(self, checkpoint: str | os.PathLike, device: str | torch.device = "cpu", batch_size: int = 32) -> None:
        from tvr.models.checkpoint import checkpoint_run, load_model

        self.path = Path(checkpoint).resolve()
        self.sha256 = file_sha256(self.path)
        run = checkpoint_run(self.path)
        model, _ = load_model(self.path, run)
        super().__init__(model, run, device, batch_size)

    def stamp(self) -> dict[str, Any]:
        from tvr.config import config_to_dict

        return {
            "encoder": "checkpoint",
            "id": self.sha256,
            "path": str(self.path),
            "head": self.cfg.head.name,
            "inference_setting": self.head.inference_setting(),
            "config": config_to_dict(self.cfg),
        }


class ConfigEncoder(ModelEncoder):
    """The model a config builds without a checkpoint (pretrained towers, CLIP from a folder; an untrained head is
    a plain cosine for the indexable heads), seeded with ``train.seed`` so that building it again gives the same
    weights. ``name`` is the preset name or file it came from (recorded, not trusted: the stamp is a hash of the
    config and every weight)."""

    def __init__(self, cfg: Any, name: str = "", device: str | torch.device = "cpu", batch_size: int = 32) -> None:
        from tvr.config import config_to_dict
        from tvr.models.build import build_model
        from tvr.models.run_spec import resolve_run
        from tvr.utils.seeding import seed_everything

        run = resolve_run(cfg)  # the backbone's image size, sampling and normalisation where the config leaves them
        seed_everything(run.config.train.seed)
        model = build_model(run)
        self.name = name
        self.config_values = config_to_dict(run.config)
        self.sha256 = weights_sha256(model, self.config_values)
        super().__init__(model, run, device, batch_size)

    def stamp(self) -> dict[str, Any]:
        return {
            "encoder": "config",
            "id": self.sha256,
            "name": self.name,
            "head": self.cfg.head.name,
            "config": self.config_values,
        }


class PretrainedEncoder(SearchEncoder):
    """A pretrained CLIP- or SigLIP-family dual encoder used zero-shot (:mod:`tvr.models.dual_encoder`): a window's
    embedding is the mean of its frames' ``get_image_features``, each normalised first, normalised again (CLIP4Clip's
    parameter-free mean pooling: every frame weighs the same whatever its feature's length, and the window is a unit
    vector, so its score with a query is their cosine); a query's is its ``get_text_features``, normalised. Both
    families score a pair by that cosine times a positive scale (plus SigLIP's bias, before its sigmoid): monotone in
    the cosine, so the ranking is the cosine's.

    The stamp's id hashes what decides the embeddings (the model's config and weights, its tokenizer's files, how
    text and frames are fed; the index records the frame sampling beside it), never where the files are: the same
    model moved to another folder, or taken from the hub cache, opens the same index."""

    #: frames sampled per window: CLIP4Clip's 1 frame a second, at most 12 (a 10 s window reads 10)
    MAX_FRAMES = 12
    FRAME_RATE = 1.0

    def __init__(self, model: str, device: str | torch.device = "cpu", batch_size: int = 32) -> None:
        from tvr.config import HeadConfig
        from tvr.data.sentence_tokenizer import SentenceTokenizer
        from tvr.data.transforms import PixelNorm
        from tvr.models.dual_encoder import load_dual_encoder, resolve_source
        from tvr.models.heads.registry import build_head

        self.source = resolve_source(model)
        dual = load_dual_encoder(self.source)
        self.sha256 = dual.content_sha256()  # before the tokenizer is first called (calls set its padding state)
        self.device = torch.device(device)
        self.model = dual.to(self.device)
        self.batch_size = batch_size
        self.spec = FrameSpec(self.MAX_FRAMES, self.FRAME_RATE, dual.image.size, "clip4clip", dual.image.resize)
        self.norm = PixelNorm(dual.image.mean, dual.image.std)
        self._tokenizer = SentenceTokenizer(dual.tokenizer)
        self._head_config = HeadConfig(name="clip4clip", options={"video_pool": "mean"})
        scale = float(dual.model.logit_scale.detach().float().item()) if hasattr(dual.model, "logit_scale") else 0.0
        self.head = build_head(self._head_config, dual.embed_dim, scale).eval()

    @property
    def max_words(self) -> int:
        return self.model.text.max_length

    def padded_lengths(self) -> list[int]:
        return [self.max_words] if self.model.text.fixed_length else padded_lengths(self.max_words)

    def stamp(self) -> dict[str, Any]:
        return {
            "encoder": "pretrained",
            "id": self.sha256,
            "source": self.source.location,
            "name": self.source.name,
            "family": self.model.family,
            "dim": self.model.embed_dim,
            "head": self.head.name,
        }

    def tokenizer(self) -> Any:
        return self._tokenizer

    def head_config(self) -> dict[str, Any]:
        from tvr.config import config_to_dict

        return config_to_dict(self._head_config)

    def token_ids(self, texts: list[str], length: int) -> tuple[Tensor, Tensor]:
        return self._tokenizer(texts, length)

    def text_features(self, texts: list[str], length: int | None = None) -> Any:
        ids, mask = self.token_ids(texts, length or self.max_words)
        return self.model.text_features({"text_ids": ids.to(self.device), "text_mask": mask.to(self.device)})

    def window_features(self, crops: Tensor, mask: Tensor) -> VideoFeatures:
        """Each real frame through ``get_image_features``; padding slots stay zero (masked out)."""
        real = mask.bool()
        frames = torch.zeros(*mask.shape, self.model.embed_dim)
        frames[real] = self.frame_features(crops[real])
        return VideoFeatures(frames.to(self.device), mask.long().to(self.device))

    @torch.no_grad()
    def frame_features(self, frames: np.ndarray | Tensor) -> Tensor:
        """``get_image_features`` of uint8 frames [n, S, S, 3], on the CPU, float32 [n, D], ``batch_size`` frames
        a pass. A frame's features depend on that frame alone, so the windows of a video, which overlap, share
        their frames' features (:func:`embed_video`)."""
        frames = torch.as_tensor(frames)
        parts = [torch.zeros(0, self.model.embed_dim)]
        for a in range(0, frames.shape[0], self.batch_size):
            chunk = frames[a : a + self.batch_size]
            pixels = _pixels(chunk[:, None], torch.ones(chunk.shape[0], 1), self.norm)[:, 0]
            parts.append(self.model.encode_frames(pixels.to(self.device)).to("cpu", torch.float32))
        return torch.cat(parts)


#: the encoder of ``tvr index`` without --checkpoint / --config: real pretrained towers, installed offline
DEFAULT_CONFIG = "two_tower/zero_shot"


def check_encoder_arguments(
    checkpoint: str | os.PathLike | None = None,
    config: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: str | None = None,
) -> tuple[str | os.PathLike | None, str | None]:
    """Check what names the model before anything loads (one line for a bad one): one of ``checkpoint``, ``model``
    and ``config``; ``overrides`` only with ``config``; the checkpoint file, the model's folder, file or hub id, the
    config. Returns ``(checkpoint, model)``, a tvr checkpoint given as ``model`` moved to ``checkpoint``."""
    if model is not None and is_tvr_checkpoint(model):
        checkpoint, model = model, None
    given = [flag for flag, value in (("--checkpoint", checkpoint), ("--model", model), ("--config", config)) if value]
    if len(given) > 1:
        raise UserError(f"give one of --model, --checkpoint and --config, not {' and '.join(given)}")
    if overrides and config is None:
        raise UserError(
            f"--set {overrides[0]}: --set changes the settings of a --config (e.g. --config two_tower/zero_shot "
            "--set model.two_tower.image_model=lite0); a checkpoint or a --model carries its own"
        )
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise UserError(f"--checkpoint {checkpoint}: {'is a folder' if Path(checkpoint).is_dir() else 'no such file'}")
    if model is not None:
        from tvr.models.dual_encoder import check_source, resolve_source

        check_source(resolve_source(model))
    if config is not None:
        from tvr.config import load_config

        load_config(config, list(overrides))
    return checkpoint, model


def load_encoder(
    checkpoint: str | os.PathLike | None = None,
    config: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    device: str = "cpu",
    model: str | None = None,
) -> SearchEncoder:
    """The encoder ``tvr index`` uses: a tvr checkpoint, a pretrained dual encoder (``model``: a preset, hub id,
    folder or OpenAI ``.pt``; a tvr checkpoint given there is one too), or the model a config (a preset name or YAML
    file, with ``--set`` overrides) builds; none of them: :data:`DEFAULT_CONFIG`."""
    checkpoint, model = check_encoder_arguments(checkpoint, config, overrides, model)
    if checkpoint is not None:
        return CheckpointEncoder(checkpoint, device=device)
    if model is not None:
        return PretrainedEncoder(model, device=device)
    from tvr.config import load_config

    name = config or DEFAULT_CONFIG
    return ConfigEncoder(load_config(name, list(overrides)), name=str(name), device=device)


def is_tvr_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file holding a tvr training checkpoint (an OpenAI CLIP ``.pt`` is not one)."""
    from tvr.models.backbones.clip.torchscript_reader import is_torchscript_archive
    from tvr.models.checkpoint import CheckpointError, read_checkpoint

    if not Path(path).is_file() or is_torchscript_archive(path):
        return False
    try:
        read_checkpoint(path, mmap=True)
    except CheckpointError:
        return False
    return True


@torch.no_grad()
def embed_video(encoder: SearchEncoder, decoded) -> tuple[torch.Tensor, Any]:
    """(shortlist embedding [W, E] float32, rerank state) of a decoded video's windows."""
    slots = decoded.slots
    mask = torch.from_numpy((slots >= 0).astype(np.int64))
    if isinstance(encoder, PretrainedEncoder):  # frames encoded one by one: each decoded frame once, not per window
        unique = encoder.frame_features(decoded.frames)
        frames = unique[torch.from_numpy(np.clip(slots, 0, None))] * mask[..., None].float()
        features = VideoFeatures(frames, mask)
    else:
        crops = torch.from_numpy(decoded.frames[np.clip(slots, 0, None)])
        features = encoder.encode_windows(crops, mask)
    head = encoder.head
    state = head.encode_videos(features)
    emb = head.shortlist_videos(state).float().cpu()
    return emb, (None if head.indexable else head.rerank_state(state))
