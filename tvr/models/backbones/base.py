"""The backbone contract: :class:`Backbone` (what tvr needs to know of one backbone) and :func:`register_backbone`.

A backbone's folder (``tvr/models/backbones/<name>/backbone.py``) imports only this module of the package, so the
registry (:mod:`tvr.models.backbones.registry`) can import every folder while it loads itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from torch import nn

from tvr.config import Config, ModelConfig, check_settings_declaration, config_to_dict, settings_fields, settings_owner
from tvr.data.feature_cache import FeatureIdentity
from tvr.data.tokenizer import TokenizerSpec
from tvr.data.transforms import CLIP_NORM, PixelNorm
from tvr.utils.plugins import qualified_name

B = TypeVar("B", bound=type["Backbone"])

#: what a backbone's features may carry: per-frame tokens (VideoFeatures.frames over several slots), per-video proxy
#: tokens (VideoFeatures.proxies) and per-token text features (TextFeatures.words)
FEATURES = ("frame_tokens", "proxies", "word_tokens")


@dataclass(frozen=True)
class Preprocess:
    """A backbone's preprocessing defaults: ``image_size`` (frame side in pixels; None when the backbone cannot tell
    without a download), ``sampling`` (``clip4clip`` or ``clipvip``, which also picks the resize) and ``norm``
    (the per-channel normalisation its image tower was trained with)."""

    image_size: int | None
    sampling: str
    norm: PixelNorm = CLIP_NORM


class NotExportableError(Exception):
    """A backbone's query side is not one the numpy query export computes (the message says why)."""


@dataclass(frozen=True)
class SentenceQuerySide:
    """A backbone's text side when it is a BERT sentence encoder with mean pooling, as its module's optional
    ``sentence_query_side(bridge)`` answers it (the numpy query export, :mod:`tvr.search.numpy_export`, asks; a
    module without the method has no such side). ``bert``: the HF ``BertModel`` (its config and weights);
    ``normalize``: the pooled vector is scaled to unit length; ``fusion``: what the bridge does to a text vector —
    ``{"kind": "none"}`` (unchanged) or ``{"kind": "fused", "weight": w, "temperature": τ}`` (class-space fusion,
    with ``class_embeddings`` [C, W])."""

    bert: Any
    normalize: bool
    fusion: dict[str, Any]
    class_embeddings: Any = None


class Backbone:
    """What tvr needs to know of one backbone; subclass it in the backbone's folder and register it.

    The module :meth:`build` returns is what :class:`~tvr.models.model.RetrievalModel` runs: ``encode_text(ids,
    mask) -> TextFeatures``, ``encode_video(pixels, frame_mask) -> VideoFeatures``, ``embed_dim``,
    ``logit_scale_value``, ``maybe_half(device)`` and ``enable_gradient_checkpointing()`` (optional:
    ``sentence_query_side(bridge) -> SentenceQuerySide``, raising :class:`NotExportableError`). Its weights are saved in
    and loaded from tvr's checkpoints with the rest of the model (``backbone.*``); :meth:`build` itself loads the
    pretrained weights the settings name.
    """

    #: the registered name (``model.backbone``), set on the instance :func:`register_backbone` registers
    name: str = ""
    #: the settings it reads, a dataclass whose fields are ``model.<key>`` keys (``clip``'s: ``model.clip``, the
    #: weights, and ``model.tiny``, a section of its own dataclass); two backbones may share a key when they
    #: declare it alike (clip and clipvip share ``clip`` and ``tiny``). None: it reads none
    Settings: ClassVar[type | None] = None
    #: shorthand for a ``Settings`` of one section, ``model.options`` of this dataclass
    Options: ClassVar[type | None] = None
    #: the model settings (``model.<field>``) its frozen features are a function of, in the order a feature cache's
    #: manifest records them (what a run on a cache must share with it: :meth:`matched_settings`)
    #: (None: ``backbone``, its own settings, ``tokenizer``, ``clip_fp16_on_cuda``)
    feature_settings: ClassVar[tuple[str, ...] | None] = None
    #: how to make it provide per-video proxies when it can (for the error a head that reads them gets), e.g.
    #: ``model.backbone=clipvip and model.clipvip.proxy_projection=true``; "" = it cannot
    proxy_hint: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        options = cls.__dict__.get("Options")
        if options is not None and "Settings" not in cls.__dict__:  # the shorthand: one key, model.options
            cls.Settings = dataclasses.make_dataclass(
                f"{cls.__name__}Settings", [("options", options, dataclasses.field(default_factory=options))]
            )

    # ------------------------------------------------------------------ declared
    def provides(self, model_cfg: ModelConfig) -> frozenset[str]:
        """Which of :data:`FEATURES` its (bridged) features carry with these settings."""
        return frozenset({"frame_tokens", "word_tokens"})

    #: its frame sampling (``data.sampling``), which picks the resize too
    sampling: ClassVar[str] = "clip4clip"

    def image_size(self, model_cfg: ModelConfig) -> int | None:
        """Its input frame size, read from the settings alone (no weights loaded); None when it cannot tell without
        a download."""
        raise NotImplementedError(f"backbone {self.name!r} declares no image size")

    def pixel_norm(self, model_cfg: ModelConfig) -> PixelNorm:
        """The per-channel normalisation its image tower was trained with (no I/O)."""
        return CLIP_NORM

    def preprocess(self, model_cfg: ModelConfig) -> Preprocess:
        """Its frame size, sampling and pixel normalisation."""
        return Preprocess(self.image_size(model_cfg), self.sampling, self.pixel_norm(model_cfg))

    def tokenizer(self, model_cfg: ModelConfig) -> TokenizerSpec:
        """The tokenizer its captions take (a kind registered in :mod:`tvr.data.tokenizer`)."""
        raise NotImplementedError(f"backbone {self.name!r} declares no tokenizer")

    def randomly_initialised(self, model_cfg: ModelConfig) -> bool:
        """Whether building it draws random weights (then ``train.seed`` decides its features too)."""
        return True

    def describe(self, model_cfg: ModelConfig) -> str:
        """One line naming it and its weights, for progress messages."""
        return f"{self.name} backbone"

    # ------------------------------------------------------------------ checks (before any weights load)
    def check_data(self, cfg: Config) -> None:
        """Refuse data settings the backbone cannot take (checked whenever a model is built)."""

    def check_image_size(self, cfg: Config) -> None:
        """Refuse a ``data.image_size`` its image tower cannot take (checked where frames are decoded)."""

    def check_head(self, cfg: Config, requires: frozenset[str]) -> None:
        """Refuse a head that reads what these settings do not make, or settings whose parameters that head leaves
        untrained (``requires``: the head's required features)."""

    # ------------------------------------------------------------------ building
    def build(self, model_cfg: ModelConfig) -> nn.Module:
        """The backbone module, with the pretrained weights its settings name."""
        raise NotImplementedError(f"backbone {self.name!r} declares no build")

    def build_bridge(self, module: nn.Module, cfg: Config, num_proxies: int) -> nn.Module | None:
        """A module mapping the backbone's features into the space the head compares in (None: they already are);
        ``num_proxies``: proxies the head reads (for a backbone that derives them)."""
        return None

    def temporal_init(self, module: nn.Module) -> nn.Module | None:
        """What ``seqTransf`` copies its initial layers from (a CLIP text tower), or None for a random init."""
        return None

    def matched_settings(self, model_cfg: ModelConfig) -> tuple[str, ...]:
        """The model settings (dotted below ``model``) a run on a feature cache must share with the cache."""
        return ("backbone", *(f.name for f in settings_fields(self.Settings)))

    # ------------------------------------------------------------------ resolution
    def feature_identity(self, cfg: Config) -> FeatureIdentity:
        """What its frozen features are a function of (:attr:`feature_settings`), and what a run on a cache must
        share with it (each with the value a cache made before the setting existed was made with: a top-level
        setting's default)."""
        values = config_to_dict(cfg.model)
        defaults = config_to_dict(ModelConfig())
        for settings in recorded_settings(self):
            defaults.update(config_to_dict(settings()))
        own = tuple(f.name for f in settings_fields(self.Settings))
        keys = self.feature_settings or ("backbone", *own, "tokenizer", "clip_fp16_on_cuda")
        settings = {f"model.{key}": values.get(key) for key in keys}
        matched = tuple(
            (f"model.{key}", _dotted(values, key), None if "." in key else defaults.get(key))
            for key in self.matched_settings(cfg.model)
        )
        return FeatureIdentity(settings, self.randomly_initialised(cfg.model), matched)


def _dotted(values: dict, key: str) -> Any:
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values


_BACKBONES: dict[str, Backbone] = {}
#: the package that ships the built-in backbones (every resolved config records their settings: recorded_settings)
_BUILTIN_PACKAGE = __name__.rpartition(".")[0] + "."


def setting_owner(key: str) -> type | None:
    """The ``Settings`` dataclass of a registered backbone that declares ``model.<key>`` (None: none does; two
    declare one key only alike, which :func:`_check_backbone_class` holds)."""
    return settings_owner(key, _declared_settings())


def _declared_settings() -> list[type | None]:
    return [type(b).Settings for b in _BACKBONES.values()]


def recorded_settings(backbone: Backbone) -> list[type]:
    """The ``Settings`` a run on ``backbone`` records, typed with their defaults: every built-in backbone's (a
    resolved config has always carried them, so the identities recorded from configs stay as they were), then the
    backbone's own."""
    builtin = [type(b).Settings for b in _BACKBONES.values() if type(b).__module__.startswith(_BUILTIN_PACKAGE)]
    ordered = [s for s in (*builtin, type(backbone).Settings) if s is not None]
    return list(dict.fromkeys(ordered))


def _check_backbone_class(cls: Any, what: str) -> type[Backbone]:
    if not (isinstance(cls, type) and issubclass(cls, Backbone)):
        raise TypeError(f"{what}: expected a Backbone subclass, got {cls!r}")
    if cls.Options is not None and not (isinstance(cls.Options, type) and dataclasses.is_dataclass(cls.Options)):
        raise TypeError(f"{what}: Options must be a dataclass, got {cls.Options!r}")
    check_settings_declaration(cls.Settings, ModelConfig, _declared_settings(), "model", what)
    return cls


def _add(name: str, cls: type[Backbone], overwrite: bool = False) -> None:
    current = _BACKBONES.get(name)
    if current is not None and not overwrite and qualified_name(type(current)) != qualified_name(cls):
        raise ValueError(f"backbone {name!r} is already registered by {type(current).__module__}")
    backbone = cls()
    backbone.name = name  # the instance's: one class may be registered under two names
    _BACKBONES[name] = backbone


def register_backbone(name: str, *, overwrite: bool = False) -> Callable[[B], B]:
    """Class decorator: make ``model.backbone == name`` use this backbone. Registering another class under a taken
    name is an error unless ``overwrite`` (re-importing the same module re-registers the same class silently)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_backbone: name must be a non-empty string without ':', got {name!r}")

    def decorate(cls: B) -> B:
        _add(name, _check_backbone_class(cls, f"register_backbone({name!r})"), overwrite)
        return cls

    return decorate


def check_token_batch(input_ids: Any, attention_mask: Any, limit: int, who: str, limit_name: str) -> None:
    """``encode_text``'s arguments as the contract has them: ids and mask of one shape [N, L], L at most ``limit``
    (``limit_name``: what that limit is, e.g. "CLIP's context length"); else ValueError naming ``who``."""
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"{who}: expected input_ids and attention_mask of the same shape [N, L], got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    if input_ids.shape[1] > limit:
        raise ValueError(
            f"{who}: {input_ids.shape[1]} tokens per caption exceed {limit_name} {limit}; lower data.max_words"
        )
