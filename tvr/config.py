"""Run configuration: nested dataclasses loaded from YAML presets with dotted ``--set`` overrides.

A preset may name another under ``base:`` (a file relative to itself, or a shipped preset by name); the child's keys
override the base's, recursively. Unknown keys are an error that names the key and the file, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import logging
import math
import os
import re
import signal
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tvr.utils.data_files import DataFileError, parse_yaml, read_yaml
from tvr.utils.errors import UserError

log = logging.getLogger(__name__)


class ConfigError(UserError, ValueError):
    """A config file or override does not match the schema."""


# --------------------------------------------------------------------------------------------- trusting code
# A head or a backbone may be named by import path (``head.name: my_pkg.heads:MyHead``, ``model.backbone:
# my_pkg.backbones:MyBackbone``); resolving it imports that module, which runs its code. A config, a checkpoint's
# config or an index's model stamp is a file, and a file is data: it may name an import path only when the user says
# the code is trusted (``tvr --trust-code``, TVR_TRUST_CODE=1, or :func:`trust_code` in Python). Registered heads and
# backbones (the package's own, ``tvr.heads`` / ``tvr.backbones`` entry points of installed packages, classes
# registered by code already running) need no trust.
_TRUST = {"code": os.environ.get("TVR_TRUST_CODE", "") not in ("", "0")}


def trust_code(enabled: bool = True) -> None:
    """Let configs, checkpoints and indexes name a head by import path (which imports, i.e. runs, that module)."""
    _TRUST["code"] = bool(enabled)


def code_trusted() -> bool:
    return _TRUST["code"]


@contextlib.contextmanager
def trusting_code() -> Iterator[None]:
    """:func:`trust_code` inside the block only."""
    before = _TRUST["code"]
    _TRUST["code"] = True
    try:
        yield
    finally:
        _TRUST["code"] = before


class UntrustedCodeError(ConfigError):
    """A config, checkpoint or index names a head by import path, and the user has not said to trust code."""


def check_import_trusted(
    name: Any, where: str = "head.name", registered: str = "registered heads (`tvr heads`)"
) -> None:
    """Refuse a head (or, with ``registered`` naming them, a backbone or a dataset format) named by import path unless
    code is trusted (see above); a plain name passes."""
    if not isinstance(name, str) or ":" not in name or code_trusted():
        return
    module = name.partition(":")[0]
    raise UntrustedCodeError(
        f"{where} = {name!r} is an import path: using it imports the module {module!r}, which runs its code, and tvr "
        "does that for a config, checkpoint or index only when told to trust it: run `tvr --trust-code ...` (or set "
        f"TVR_TRUST_CODE=1; in Python, tvr.config.trust_code()); {registered} need no trust"
    )


def import_named(spec: str, where: str) -> Any:
    """The object an import path ``package.module:Name`` (``Name`` may be dotted) names, for the field ``where``
    (``head.name``, ``model.backbone``); ConfigError naming what is wrong. The caller checks trust first."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{where} = {spec!r}: an import path must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where} = {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where} = {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


#: what a backbone refused for want of trust says needs none
REGISTERED_BACKBONES = "registered backbones (`model.backbone` names: the package's folders and entry points)"
#: what a dataset format refused for want of trust says needs none
REGISTERED_DATASETS = "registered dataset formats (`data.dataset` names: tvr/data/formats and entry points)"


#: ceilings of the sizes of randomly initialised models (``model.tiny``, ``model.two_tower.tiny``, the temporal
#: transformer): ViT-B/16's fit; a 24-layer, 1024-wide text and vision tower with a 262,144-word vocabulary is about
#: 3.5 GB of float32, the most a config can make tvr allocate before any checkpoint tensor is compared with it
MAX_TINY_WIDTH = 1024
MAX_TINY_LAYERS = 24
MAX_TINY_HEADS = 64

# --------------------------------------------------------------------------------------------- field helpers
# Choices and ranges live in the field metadata, so every section (and every head's options dataclass) is checked
# the same way when it is loaded: a bad value fails at once with the field's dotted name and the valid values.


def choice(default: str | None, *values: str) -> Any:
    """A string field restricted to ``values`` (``default`` must be one of them, or None: a field left unset, which
    something else fills in, e.g. ``data.sampling`` from the backbone)."""
    if default is not None and default not in values:
        raise ValueError(f"choice default {default!r} is not among {values}")
    return field(default=default, metadata={"choices": tuple(values), "allow": (None,) if default is None else ()})


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    allow: tuple = (),
) -> Any:
    """A numeric field restricted to a range; values in ``allow`` (e.g. 0 meaning "off") are accepted as well."""
    return field(default=default, metadata={"range": (ge, gt, le, lt), "allow": tuple(allow)})


def declared_settings() -> Any:
    """The store of a section's plug-in settings: the keys its plug-in declares (a backbone's ``model.<key>``, a
    dataset format's ``data.<key>``), held as loaded (a mapping or a value) until the run is resolved and then as
    typed values; written out beside the section's own fields, so a recorded config reads the same either way."""
    return field(default_factory=dict, metadata={"declared": True})


class DeclaredSettings:
    """A section whose plug-in declares some of its keys (:func:`declared_settings` holds them): they read and set
    like fields (``cfg.model.clipvip``, ``cfg.data.train_split``). The layer below the plug-ins cannot know their
    defaults, so a key the loaded config does not set is there once the run is resolved
    (``tvr.models.run_spec.resolve_run``), not before."""

    def __getattr__(self, name: str) -> Any:  # only reached when ``name`` is not an attribute
        store = self.__dict__.get("declared")
        if name.startswith("__") or store is None:
            raise AttributeError(name)
        if name in store:
            return store[name]
        raise AttributeError(
            f"{type(self).__name__}.{name}: not set; a setting a plug-in declares has its default once the run is "
            "resolved (tvr.models.run_spec.resolve_run)"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dataclass_fields__ or name.startswith("_"):  # type: ignore[attr-defined]
            object.__setattr__(self, name, value)
        else:
            self.__dict__["declared"][name] = value


def takes_declared_keywords(cls: type) -> type:
    """Class decorator over a ``@dataclass`` with :func:`declared_settings`: its constructor also takes the declared
    settings as keywords (``ModelConfig(clip="tiny", tiny=TinyClipConfig())``), as it did when they were fields."""
    init = cls.__init__
    own = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(init)
    def init_taking_declared(self: Any, *args: Any, **kwargs: Any) -> None:
        declared = {key: kwargs.pop(key) for key in list(kwargs) if key not in own}
        init(self, *args, **kwargs)
        self.declared = {**self.declared, **declared}  # its own mapping: dataclasses.replace passes the old one

    cls.__init__ = init_taking_declared  # type: ignore[misc]
    return cls


def _range_text(ge: Any, gt: Any, le: Any, lt: Any) -> str:
    low = f">= {ge}" if ge is not None else (f"> {gt}" if gt is not None else "")
    high = f"<= {le}" if le is not None else (f"< {lt}" if lt is not None else "")
    return " and ".join(p for p in (low, high) if p)


def field_rule_text(f: dataclasses.Field) -> str:
    """What a ``choice`` / ``bounded`` field accepts, for listings (``tvr heads``): "mean | max", ">= 0 and < 1 (or
    0)", or "" for a field with no such rule."""
    choices = f.metadata.get("choices")
    if choices:
        return " | ".join(map(str, choices)) + (" (or null)" if None in f.metadata.get("allow", ()) else "")
    bounds = f.metadata.get("range")
    if not bounds:
        return ""
    allow = f.metadata.get("allow") or ()
    return _range_text(*bounds) + (f" (or {', '.join(map(repr, allow))})" if allow else "")


def check_field_values(obj: Any, where: str) -> None:
    """Check every field of dataclass ``obj`` against its ``choice``/``bounded`` metadata (not recursive), then the
    class's own ``validate()`` for rules that span fields (its ValueError message starts with the field name).
    Raises ConfigError naming ``where.field``."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{where}.{f.name}" if where else f.name
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices and value not in f.metadata.get("allow", ()):
            unset = " (or null)" if None in f.metadata.get("allow", ()) else ""
            raise ConfigError(f"{name} = {value!r}: expected one of {list(choices)}{unset}")
        bounds = f.metadata.get("range")
        if bounds is not None and value is not None and value not in f.metadata.get("allow", ()):
            ge, gt, le, lt = bounds
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = number and math.isfinite(value)
            ok = ok and (ge is None or value >= ge) and (gt is None or value > gt)
            ok = ok and (le is None or value <= le) and (lt is None or value < lt)
            if not ok:
                extra = f" (or {', '.join(map(repr, f.metadata['allow']))})" if f.metadata.get("allow") else ""
                raise ConfigError(f"{name} = {value!r}: expected a number {_range_text(ge, gt, le, lt)}{extra}")
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as exc:
            # validate() messages start with the field name, so the dotted path reads naturally
            raise ConfigError(f"{where}.{exc}" if where else str(exc)) from None


# --------------------------------------------------------------------------------------------- schema
# Choice lists name the implementations' own constants (tests/test_config.py checks that they agree).

SAMPLINGS = ("clip4clip", "clipvip")
TEMPORALS = ("meanP", "seqTransf", "none")
SCHEDULES = ("warmup_cosine", "constant")
#: ``train.amp_dtype`` values
AMP_DTYPES = ("auto", "bf16", "fp16")
TIE_MODES = ("optimistic", "reference")
METRIC_DIRECTIONS = ("t2v", "v2t", "t2v_dsl", "v2t_dsl")
METRIC_NAMES = ("R1", "R5", "R10", "MdR", "MnR")
#: ``train.select_metric`` values: one direction's metric, or ``mean/<metric>``, the mean of t2v's and v2t's (a
#: criterion that sees both directions; tvr.utils.metric_paths.BOTH_DIRECTIONS)
SELECT_METRICS = tuple(f"{d}/{m}" for d in (*METRIC_DIRECTIONS, "mean") for m in METRIC_NAMES)
#: ``train.preemption_signals`` values: the termination notices schedulers send (SLURM, LSF, Kubernetes, torchrun),
#: those this system has; never a fault signal (SIGSEGV, …) or one that cannot be caught (SIGKILL)
PREEMPTION_SIGNALS = tuple(
    name
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT", "SIGXCPU", "SIGALRM")
    if hasattr(signal, name)
)


@takes_declared_keywords
@dataclass
class DataConfig(DeclaredSettings):
    #: a registered dataset format (``tvr/data/formats/<name>.py``): msrvtt | msvd | didemo | activitynet | generic,
    #: or one registered from elsewhere (``tvr.data.formats.registry.register_dataset_format``); checked when the run
    #: is resolved, as ``head.name`` and ``model.backbone`` are
    dataset: str = "msrvtt"
    #: the settings only the dataset format reads (``data.<key>``, its ``Settings``: msrvtt's ``train_split``,
    #: generic's ``generic_file``; ``tvr datasets`` lists them), held as loaded until the run config is resolved
    declared: Any = declared_settings()
    #: folder holding the dataset's annotation files (standard names, see docs/datasets.md)
    annotations: str = ""
    #: folder holding the video files
    video_dir: str = ""
    #: how a video id becomes a file name inside ``video_dir`` (``{video_stem}``: the id without its extension)
    video_pattern: str = "{video_id}.mp4"
    #: allow video files that resolve (after ``..`` and symlinks) outside ``video_dir``; off: such a video is skipped
    #: and listed with reason "outside video_dir" (a stray ``../x.mp4`` or absolute path in a user CSV)
    allow_outside_video_dir: bool = False
    #: fraction of training videos held out for validation where a dataset has no official val split
    val_fraction: float = bounded(0.05, ge=0.0, lt=1.0)
    val_seed: int = 0
    max_words: int = bounded(32, ge=3, le=1024)
    max_frames: int = bounded(12, ge=1, le=1024)
    #: candidate frames per second before uniform sub-sampling to ``max_frames`` (CLIP4Clip: 1)
    frame_rate: float = bounded(1.0, gt=0.0)
    #: frame side in pixels; unset (null) = the backbone's input size (a CLIP's vision tower: 224 for ViT-B/32 and
    #: B/16; tiny: model.tiny.image_size), filled in when the run config is resolved, as open_clip's model configs
    #: carry their preprocessing
    image_size: int | None = bounded(None, ge=1)
    #: clip4clip (1-fps candidates, uniform pick, zero padding; short-side resize + centre crop) | clipvip
    #: (linspace over decoded frames; square resize); unset (null) = the backbone's (clip → clip4clip, clipvip →
    #: clipvip)
    sampling: str | None = choice(None, *SAMPLINGS)
    #: per-channel mean and std of RGB values in [0, 1] the frames are normalised with; unset (null) = the
    #: backbone's (CLIP's for clip / clipvip, EfficientNet-Lite's for two_tower)
    pixel_mean: tuple[float, float, float] | None = None
    pixel_std: tuple[float, float, float] | None = None
    #: training pairs per epoch: all_pairs (every caption once, CLIP4Clip) | one_per_video (one caption drawn per
    #: video per epoch, CLIP-ViP's MSR-VTT recipe: an epoch = #videos items; the draw is a pure function of
    #: (train.seed, epoch, video), so a resumed run sees the same captions). Datasets with one text per video
    #: (DiDeMo/ActivityNet paragraphs) are unaffected.
    caption_sampling: str = choice("all_pairs", "all_pairs", "one_per_video")
    #: video-consistent RandAugment on training clips (GARE recipe); never applied at eval
    augment: bool = False
    augment_magnitude: float = bounded(7.0, ge=0.0, le=10.0)
    augment_num_ops: int = bounded(4, ge=0)
    #: decoding worker processes per loader (0 = decode in the main process); a loader uses at most one per CPU the
    #: process may use (one log note says so), so a GPU preset's 8 does not oversubscribe a small machine
    num_workers: int = bounded(0, ge=0)
    #: folder of a ``tvr features`` cache; when set, training/eval read features instead of videos
    features_dir: str = ""
    #: folder of a ``tvr prepare frames`` cache of ``video_dir`` built with this config's frame settings: clips are
    #: read from it instead of decoded (evaluation, and training under clip4clip sampling); "" = decode every clip
    frame_cache: str = ""
    #: restrict to the first N training pairs / test items (0 = all); for smoke runs
    limit_train: int = bounded(0, ge=0)
    limit_eval: int = bounded(0, ge=0)


# --------------------------------------------------------------------------------------------- model
# A backbone's settings are its own, declared in its folder (``tvr/models/backbones/<name>/``: its ``Settings``
# dataclass), which this layer cannot import; every backbone, built in or not, is configured the same way, by the
# ``model.<key>`` keys its ``Settings`` has (the CLIP backbones' ``model.clip`` and ``model.tiny``, CLIP-ViP's
# ``model.clipvip``, the two-tower's ``model.two_tower``, another package's backbone its own). This layer holds them
# as loaded; resolving the run config (``tvr.models.run_spec.resolve_run``) types them.


@takes_declared_keywords
@dataclass
class ModelConfig(DeclaredSettings):
    #: the settings the backbone declares (``model.<key>``: its ``Settings`` dataclass; ``tvr backbones`` lists
    #: them), held as loaded until the run config is resolved
    declared: Any = declared_settings()
    #: a registered backbone (``tvr/models/backbones/<name>/``): clip (per-frame CLIP image features, then ``temporal``)
    #: | clipvip (CLIP-ViP video tower on the same CLIP weights: one pooled video feature + M proxies; needs
    #: ``temporal: none``) | two_tower (a sentence-transformers text model + an ImageNet image model, section
    #: ``two_tower``; ``clip`` and ``tiny`` are not used) | one registered by another package
    backbone: str = "clip"
    #: folder with the tokenizer files (vocab.json + merges.txt); empty = the checkpoint's own
    tokenizer: str = ""
    #: train only the temporal module and the head (always true when training on cached features)
    freeze_backbone: bool = False
    #: meanP | seqTransf | none (with ``backbone: clipvip``: none or meanP, both the identity on its one slot)
    temporal: str = choice("seqTransf", *TEMPORALS)
    temporal_layers: int = bounded(4, ge=1, le=MAX_TINY_LAYERS)
    #: on CUDA, cast a CLIP that does not train (frozen backbone, ``tvr features``, ``tvr eval``) to fp16 as the
    #: reference does; a trainable backbone keeps fp32 weights and trains under AMP instead
    clip_fp16_on_cuda: bool = True
    #: recompute the trainable backbone's transformer layers (CLIP, CLIP-ViP; the two-tower text model and image
    #: blocks) in the backward pass instead of keeping their activations: less memory per step, one extra forward
    gradient_checkpointing: bool = False
    #: encode at most this many frames per vision forward pass (0 = all frames of the batch at once); clipvip
    #: encodes whole videos, max(1, frame_chunk // F) per pass; two_tower: 0 = 16 frames per pass (a CNN's
    #: activations at 224 px are large)
    frame_chunk: int = bounded(0, ge=0)

    def validate(self) -> None:
        if not isinstance(self.backbone, str) or not self.backbone:
            raise ValueError(f"backbone = {self.backbone!r}: expected the name of a registered backbone")


@dataclass
class HeadConfig:
    """The method head: its registered name (or ``package.module:Class``) and that head's own options.

    ``options`` is the mapping read from a file until the run config is resolved
    (``tvr.models.run_spec.resolve_run``, before anything runs): the resolved config's options are the head's options
    dataclass, checked (unknown keys, types, choices, ranges), the one state every later reader sees.
    """

    #: a registered head (clip4clip, gare, ...; see ``tvr heads``) or an import path ``my_pkg.heads:MyHead`` (which
    #: imports that module: only with ``tvr --trust-code``)
    name: str = "clip4clip"
    #: None = take the backbone's logit_scale (pretrained CLIP: ln 100)
    logit_scale_init: float | None = None
    logit_scale_max: float = bounded(4.605170185988092, gt=0.0)
    #: the head's options (its ``Options`` dataclass; fields and defaults in docs/methods/<head>.md)
    options: Any = field(default_factory=dict)


@dataclass
class TrainConfig:
    epochs: int = bounded(5, ge=1)
    batch_size: int = bounded(128, ge=1)
    lr: float = bounded(1e-4, gt=0.0)
    #: backbone (CLIP) lr = lr × coef (spec §1.4: 1e-3)
    backbone_lr_coef: float = bounded(1e-3, ge=0.0)
    weight_decay: float = bounded(0.2, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = bounded(1e-6, gt=0.0)
    #: warmup_cosine | constant
    schedule: str = choice("warmup_cosine", *SCHEDULES)
    warmup: float = bounded(0.1, ge=0.0, lt=1.0)
    #: when > 0, the schedule spans this many epochs regardless of ``epochs`` (the GARE reference uses 5)
    schedule_epochs: int = bounded(0, ge=0)
    grad_clip: float = bounded(1.0, ge=0.0)
    #: autocast on CUDA (bf16 where supported, else fp16 with a grad scaler); ignored on CPU unless amp_dtype
    #: names a dtype
    amp: bool = True
    #: auto (CUDA: bf16 where the GPU has it, else fp16; CPU: no autocast) | bf16 | fp16 (with a grad scaler), on
    #: any device (docs/scaling.md)
    amp_dtype: str = choice("auto", *AMP_DTYPES)
    seed: int = 42
    #: auto | cpu | cuda | cuda:N
    device: str = "auto"
    #: intra-op CPU threads for torch (0 = torch's default); small models on a busy CPU run faster with 1
    num_threads: int = bounded(0, ge=0)
    #: also write last.pt every N optimizer steps (0 = only at epoch ends); a mid-epoch checkpoint holds the position
    #: in the epoch's data order, so a resume continues the exact batch sequence (``checkpoint_every`` before)
    save_every_steps: int = bounded(0, ge=0)
    log_every: int = bounded(10, ge=0)
    #: evaluate on the validation split every N steps (0 = at epoch ends only)
    eval_every: int = bounded(0, ge=0)
    #: stop after this many optimizer steps (0 = run all epochs); for smoke runs
    max_steps: int = bounded(0, ge=0)
    #: select the checkpoint kept as best.pt by this validation metric (direction/metric)
    select_metric: str = choice("t2v/R1", *SELECT_METRICS)
    #: signals that stop training gracefully (every rank finishes its step, last.pt is written, exit code 143); a
    #: second one ends the process at once; [] = the signals' default action (docs/scaling.md, "Preemption")
    preemption_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")

    def validate(self) -> None:
        for k, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas[{k}] = {beta!r}: expected a number >= 0 and < 1")
        if self.device != "auto" and not re.fullmatch(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?", self.device):
            raise ValueError(f"device = {self.device!r}: expected auto, cpu, cuda or cuda:N")
        for k, name in enumerate(self.preemption_signals):
            if name not in PREEMPTION_SIGNALS:
                raise ValueError(f"preemption_signals[{k}] = {name!r}: expected one of {list(PREEMPTION_SIGNALS)}")


@dataclass
class EvalConfig:
    batch_size: int = bounded(64, ge=1)
    text_chunk: int = bounded(0, ge=0)
    video_chunk: int = bounded(0, ge=0)
    #: optimistic (rank = 1 + #strictly higher) | reference (CLIP4Clip tie expansion)
    tie_mode: str = choice("optimistic", *TIE_MODES)
    #: also report dual-softmax (DSL) re-weighted scores as an extra column
    dsl: bool = False
    #: also report QB-Norm (dynamic inverted softmax over a query bank of training captions) as the row t2v_qbnorm
    qbnorm: bool = False
    #: also report the inverted softmax as the row t2v_invsoftmax (over the query bank when one is given, else over
    #: the evaluated queries themselves)
    inverted_softmax: bool = False
    #: β of QB-Norm and the inverted softmax (QB-Norm paper: 20)
    qbnorm_beta: float = bounded(20.0, gt=0.0)
    #: QB-Norm activation set: gallery items among the top-k results of some bank query (QB-Norm paper: 1)
    qbnorm_k: int = bounded(1, ge=1)
    #: training captions in the query bank: 0 = all of them, N = N evenly spaced ones
    query_bank_size: int = bounded(0, ge=0)
    #: the split evaluated: val | test | train, or one a dataset format adds (msrvtt: test_multi, every caption of
    #: the 1k-A test); checked when the run is resolved, against the registered formats
    split: str = "test"
    #: two-stage scoring for large galleries (our extension, not the papers' protocol): each text shortlists K
    #: videos and each video K texts by the head's shortlist embedding, only those get the exact score, a match
    #: outside its shortlist ranks last (0 = score every pair exactly)
    rerank_k: int = bounded(0, ge=0)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> None:
        if self.train.select_metric.split("/")[0].endswith("_dsl") and not self.eval.dsl:
            raise ValueError(f"train.select_metric = {self.train.select_metric!r} needs eval.dsl = true")


# --------------------------------------------------------------------------------------------- loading


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Convert a YAML value to the field's annotated type, or raise ConfigError naming ``where``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(value, non_none[0], where)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(annotation, value, where)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list of values, got {value!r}")
        return tuple(_coerce(v, args[0], f"{where}[{k}]") for k, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{where}[{k}]") for k, (v, a) in enumerate(zip(value, args, strict=True)))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):
            # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is Any:
        return value
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, values: dict, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    store = next((f.name for f in fields if f.metadata.get("declared")), None)
    known = {f.name for f in fields} - {store}
    unknown = sorted(set(values) - known)
    if (unknown and store is None) or (store is not None and store in values):  # the store is no key of its own
        raise ConfigError(f"{where or 'config'}: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for f in fields:
        if f.name in values:
            name = f"{where}.{f.name}" if where else f.name
            kwargs[f.name] = _coerce(values[f.name], hints[f.name], name)
    if store is not None:  # checked against the plug-in's Settings when the run config is resolved
        kwargs[store] = {key: copy.deepcopy(values[key]) for key in unknown}
    obj = cls(**kwargs)
    check_field_values(obj, where)
    return obj


def build_section(cls: type, values: Any, where: str) -> Any:
    """Build the config dataclass ``cls`` from a mapping (or check an instance of it): unknown keys, types, choices
    and ranges fail with a ConfigError naming ``where.key``. Heads use it for their options (``head.options``)."""
    if isinstance(values, cls):
        check_field_values(values, where)
        for f in dataclasses.fields(values):
            child = getattr(values, f.name)
            if dataclasses.is_dataclass(child) and not isinstance(child, type):
                build_section(type(child), child, f"{where}.{f.name}")
        return values
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {values!r}")
    return _build(cls, values, where)


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (its factory's product for a ``default_factory`` field)."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def settings_fields(settings: type | None) -> tuple[dataclasses.Field, ...]:
    """The keys a plug-in's ``Settings`` dataclass declares (none for a plug-in without one)."""
    return dataclasses.fields(settings) if settings is not None else ()


def settings_owner(key: str, declared: Iterable[type | None]) -> type | None:
    """The first of the ``Settings`` dataclasses ``declared`` that has ``key`` (None: none has)."""
    return next((s for s in declared if any(f.name == key for f in settings_fields(s))), None)


def declaration_text(settings: type, key: str) -> str:
    """How the ``Settings`` dataclass ``settings`` declares ``key`` (its type and default): two plug-ins may declare
    one key only alike."""
    found = next(f for f in dataclasses.fields(settings) if f.name == key)
    kind = typing.get_type_hints(settings)[key]
    name = f"{kind.__module__}.{kind.__qualname__}" if isinstance(kind, type) else repr(kind)
    return f"{name} = {config_to_dict(field_default(found))!r}"


def check_settings_declaration(
    settings: Any, section: type, declared: Iterable[type | None], where: str, what: str
) -> None:
    """Refuse a plug-in's ``Settings`` (named ``what``) for the ``where`` section (of dataclass ``section``) that is
    no dataclass (TypeError), or that declares a key the section has itself or one that another of the ``declared``
    declares otherwise (ValueError)."""
    if settings is None:
        return
    if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise TypeError(f"{what}: Settings must be a dataclass, got {settings!r}")
    own = {f.name for f in dataclasses.fields(section)}
    for f in dataclasses.fields(settings):
        if f.name in own:
            raise ValueError(f"{what}: {where}.{f.name} is a field of every {where} section; name it otherwise")
        owner = settings_owner(f.name, declared)
        if owner is not None and declaration_text(owner, f.name) != declaration_text(settings, f.name):
            raise ValueError(
                f"{what}: {where}.{f.name} is already declared otherwise by {owner.__module__}.{owner.__qualname__}"
            )


def typed_declared_settings(
    section: Any, own: type | None, recorded: list[type], declared: list[type | None], where: str
) -> dict[str, Any]:
    """The settings the plug-ins declare in ``section`` (the ``where`` section: "model" or "data") built into their
    ``Settings``: every dataclass in ``recorded`` with its defaults, then, for each other key the section sets, the
    one of ``declared`` (every registered plug-in's) that has it. ConfigError for a key none declares (listing the
    section's fields and ``own``'s, the chosen plug-in's) or a value that does not fit (naming the field)."""
    plain = {key: config_to_dict(value) for key, value in section.declared.items()}
    owners = {key: settings_owner(key, declared) for key in plain}
    unknown = sorted(key for key, owner in owners.items() if owner is None)
    if unknown:
        valid = {f.name for f in dataclasses.fields(section) if not f.metadata.get("declared")}
        valid |= {f.name for f in settings_fields(own)}
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(valid)}")
    typed: dict[str, Any] = {}
    for settings in dict.fromkeys([*recorded, *owners.values()]):
        names = [f.name for f in dataclasses.fields(settings)]
        built = build_section(settings, {name: plain[name] for name in names if name in plain}, where)
        for name in names:
            typed.setdefault(name, getattr(built, name))
    return typed


def _switch_head(values: dict, name: Any) -> None:
    """Set ``head.name``; switching to another head drops the options inherited for the previous one (they belong
    to its options dataclass, not the new head's)."""
    head = values.get("head")
    if not isinstance(head, dict):
        head = values["head"] = {}
    if head.get("name", HeadConfig.name) != name:
        head.pop("options", None)
    head["name"] = name


def _merge(base: dict, override: dict, top: bool = False) -> dict:
    out = dict(base)
    if top and isinstance(override.get("head"), dict) and "name" in override["head"]:
        out = {**out, "head": dict(out["head"]) if isinstance(out.get("head"), dict) else {}}
        _switch_head(out, override["head"]["name"])
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: circular 'base' chain {[str(p) for p in seen]}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = read_yaml(path) or {}
    except DataFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    # what the file is (`tvr presets` shows it), not a setting: each file describes itself, nothing inherits it
    _check_description(raw.pop("description", ""), path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    return _merge(_read_yaml(_base_path(path, base), (*seen, path)), raw, top=True)


def _base_path(path: Path, base: Any) -> Path:
    """The file ``base:`` names in ``path``: a file relative to ``path``'s folder, else a shipped preset's name
    (``base: clipvip/msrvtt``: a method's preset builds on a backbone's, which lives in another folder)."""
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base: expected a file name or a preset name, got {base!r}")
    relative = path.parent / base
    if relative.is_file():
        return relative
    shipped = _shipped_preset(Path(base).as_posix())
    if shipped is not None:
        return shipped
    raise ConfigError(f"{path}: base: {base!r} is neither a file beside it nor a shipped preset (`tvr presets`)")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` → (["train", "lr"], 3e-4); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. train.lr=3e-4")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = parse_yaml(raw, "the override") if raw.strip() else ""
    except DataFileError as exc:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ConfigError(f"override {shown!r}: the value is {exc.problem}") from None
    return parts, value


#: functions that rewrite a raw config mapping written by an older tvr into today's layout, applied in order by
#: :func:`config_from_dict` (so by :func:`load_config` and every checkpoint's config, whatever has been imported).
_MIGRATIONS: list[Callable[[dict], dict]] = []


def register_migration(migrate: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """Apply ``migrate`` (raw mapping in, raw mapping out; return the input unchanged when it does not apply) to
    every config mapping loaded from now on. Registering the same function again is a no-op."""
    if migrate not in _MIGRATIONS:
        _MIGRATIONS.append(migrate)
    return migrate


@register_migration
def migrate_checkpoint_every(values: dict) -> dict:
    """``train.checkpoint_every`` (configs, run folders and checkpoints written before the rename) is read as
    ``train.save_every_steps``."""
    train = values.get("train")
    if not isinstance(train, dict) or "checkpoint_every" not in train:
        return values
    train = dict(train)
    every = train.pop("checkpoint_every")
    if train.setdefault("save_every_steps", every) != every:
        raise ConfigError(
            "train.checkpoint_every is the old name of train.save_every_steps, and both are set to different values; "
            "keep train.save_every_steps"
        )
    return {**values, "train": train}


#: head option sections of configs written before ``head.options`` existed (each head's options sat under its
#: name; GARE's two-stage ``rerank_k`` has since moved to ``eval.rerank_k``)
LEGACY_HEAD_SECTIONS = ("clip4clip", "gare")


@register_migration
def migrate_legacy_head_sections(values: dict) -> dict:
    """Accept a run config written before heads declared their own options: ``head.<name>`` → ``head.options``
    (other heads' sections dropped) and ``head.gare.rerank_k`` → ``eval.rerank_k``; warns once per config."""
    head = values.get("head")
    if not isinstance(head, dict) or not any(k in head for k in LEGACY_HEAD_SECTIONS):
        return values
    values, head = dict(values), dict(head)
    name = head.get("name", HeadConfig.name)
    legacy = {k: head.pop(k) for k in LEGACY_HEAD_SECTIONS if k in head}
    options = legacy.get(name)
    if isinstance(options, dict):
        options = dict(options)
        rerank = options.pop("rerank_k", None)
        if rerank:
            values["eval"] = {**(values.get("eval") or {}), "rerank_k": rerank}
        if "options" in head:
            raise ConfigError(f"head: both head.options and the old head.{name} section are set; keep head.options")
        head["options"] = options
    log.warning(
        "config: head.%s sections are the old layout; head options now live under head.options", "/".join(legacy)
    )
    values["head"] = head
    return values


def config_from_dict(values: dict, where: str = "config") -> Config:
    """A :class:`Config` from a nested mapping; every section is checked (the head's options are checked when the
    run config is resolved against the head registry). Registered migrations rewrite an older layout first."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    for migrate in _MIGRATIONS:
        values = migrate(values)
    config = _build(Config, values, "" if where == "config" else where)
    prefix = "" if where == "config" else f"{where}."
    check_import_trusted(config.head.name, f"{prefix}head.name")
    check_import_trusted(config.model.backbone, f"{prefix}model.backbone", REGISTERED_BACKBONES)
    check_import_trusted(config.data.dataset, f"{prefix}data.dataset", REGISTERED_DATASETS)
    return config


_PACKAGE_DIR = Path(__file__).resolve().parent
#: the presets of no one family (``cpu/``: the CPU-sized runs of every method; ``bench/``: ``tvr bench`` configs),
#: addressed as ``<folder>/<name>``; a method's or a backbone's presets ship in its own folder (:func:`preset_folders`)
PRESET_DIR = _PACKAGE_DIR / "configs"
#: the folders of the families whose members may ship presets, each in its ``<member>/presets/`` folder
#: (``tvr/methods/gare/presets/msrvtt.yaml`` is ``gare/msrvtt``); found as files, no module is imported
PRESET_FAMILIES = (_PACKAGE_DIR / "methods", _PACKAGE_DIR / "models" / "backbones")


#: ``tvr/configs/bench/`` holds ``tvr bench`` configs (methods × seeds), not run configs
BENCH_SUBDIR = "bench"


def preset_folders() -> dict[str, Path]:
    """Where each preset name prefix lives: ``cpu`` and ``bench`` in :data:`PRESET_DIR`, and ``<member>`` in
    ``tvr/methods/<member>/presets/`` or ``tvr/models/backbones/<member>/presets/``."""
    folders = {p.name: p for p in sorted(PRESET_DIR.iterdir()) if p.is_dir() and not p.name.startswith(("_", "."))}
    for family in PRESET_FAMILIES:
        for folder in sorted(family.glob("*/presets")):
            taken = folders.setdefault(folder.parent.name, folder)
            if taken != folder:  # a name two folders claim would make a preset name mean two files
                raise ConfigError(f"presets {folder} and {taken} both claim the name {folder.parent.name!r}/")
    return folders


def available_presets() -> list[str]:
    """Names of the presets shipped with tvr (``gare/msrvtt``, ``gare/ablations/delta_only``, ...); the bench
    configs in ``tvr/configs/bench/`` are not run presets and are left out."""
    names = (
        f"{prefix}/{p.relative_to(folder).with_suffix('').as_posix()}"
        for prefix, folder in preset_folders().items()
        if prefix != BENCH_SUBDIR
        for p in folder.rglob("*.yaml")
    )
    return sorted(names)


def _shipped_preset(text: str) -> Path | None:
    """The file of the shipped preset named ``text`` (``gare/msrvtt`` or ``gare/msrvtt.yaml``), None if none."""
    prefix, _, rest = text.partition("/")
    folder = preset_folders().get(prefix)
    if folder is None or not rest:
        return None
    candidate = (folder / (rest if rest.endswith((".yaml", ".yml")) else f"{rest}.yaml")).resolve()
    return candidate if candidate.is_file() and candidate.is_relative_to(folder.resolve()) else None


def preset_values(name_or_path: str | os.PathLike) -> dict:
    """The raw mapping of a preset (a shipped name or a file), its ``base`` chain merged, before any check: for a
    caller that builds its config from a preset (``tvr demo`` from ``cpu/clip4clip``)."""
    return _read_yaml(preset_path(name_or_path))


def _check_description(description: Any, path: Path) -> str:
    if not isinstance(description, str) or "\n" in description.strip():
        raise ConfigError(f"{path}: description: expected one line of text, got {description!r}")
    return description.strip()


def preset_description(name_or_path: str | os.PathLike) -> str:
    """The one-line ``description:`` a preset file gives itself (what it is, which paper table or ablation, what
    hardware it expects); "" when it has none. A ``base:`` preset's description is not inherited."""
    path = preset_path(name_or_path)
    try:
        raw = read_yaml(path) or {}
    except DataFileError as exc:
        raise ConfigError(str(exc)) from None
    return _check_description(raw.get("description", "") if isinstance(raw, dict) else "", path)


def preset_path(name_or_path: str | os.PathLike) -> Path:
    """A config file: an existing file path as given, else a shipped preset by name (``gare/msrvtt``, with or without
    ``.yaml``; ``configs/gare/msrvtt.yaml`` and ``tvr/configs/gare/msrvtt.yaml``, the layouts before presets moved
    into their method's folder, too)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = Path(name_or_path).as_posix()
    for prefix in ("tvr/configs/", "configs/"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    shipped = _shipped_preset(text)
    if shipped is not None:
        return shipped
    if path.exists():
        raise ConfigError(f"config {name_or_path}: is a folder, expected a YAML file or a preset name")
    stem = Path(text).name.removesuffix(".yaml").removesuffix(".yml")
    close = [n for n in available_presets() if Path(n).name == stem]
    hint = f"; did you mean {close}?" if close else " (`tvr presets` lists them)"
    raise ConfigError(f"config {name_or_path}: no such file and no shipped preset of that name{hint}")


def _field_type(keys: list[str]) -> Any:
    """The annotation of the config field at dotted ``keys`` (None when it is not a schema field, e.g. a head
    option: those are typed by the head's own dataclass)."""
    cls: Any = Config
    for key in keys[:-1]:
        if not dataclasses.is_dataclass(cls):
            return None
        cls = typing.get_type_hints(cls).get(key)  # a plug-in's setting has none: typed when the run is resolved
    return typing.get_type_hints(cls).get(keys[-1]) if dataclasses.is_dataclass(cls) else None


def _is_declared_setting(keys: list[str]) -> bool:
    """Whether dotted ``keys`` name a plug-in's own setting, ``<section>.<key>`` of a section with a
    :func:`declared_settings` store."""
    section = typing.get_type_hints(Config).get(keys[0]) if len(keys) == 2 else None
    return dataclasses.is_dataclass(section) and any(f.metadata.get("declared") for f in dataclasses.fields(section))


def _is_text_field(annotation: Any) -> bool:
    if annotation is str:
        return True
    args = typing.get_args(annotation)
    return (
        typing.get_origin(annotation) in (typing.Union, types.UnionType)
        and str in args
        and len([a for a in args if a is not type(None)]) == 1
    )


def _parse_override_for_field(text: str) -> tuple[list[str], Any]:
    """:func:`parse_override`, except that a text field takes the value as written when YAML would read a mapping
    or a list, or nothing valid at all: ``data.video_pattern={video_id}.mp4`` is a pattern, not YAML. A backbone's or
    a dataset format's own setting (``model.clip``, ``data.generic_file``: typed when the run is resolved) takes
    YAML's value, and the text as written where it is no valid YAML."""
    if "=" not in text:
        return parse_override(text)
    keys = [p for p in text.split("=", 1)[0].strip().split(".") if p]
    field_type = _field_type(keys)
    if _is_text_field(field_type) or (field_type is None and _is_declared_setting(keys)):
        raw = text.split("=", 1)[1]
        try:
            keys, value = parse_override(text)
        except ConfigError:
            return [p for p in text.split("=", 1)[0].strip().split(".") if p], raw.strip()
        return keys, raw.strip() if field_type is not None and isinstance(value, (dict, list)) else value
    return parse_override(text)


def blame_overrides(exc: ConfigError, overrides: list[str] | tuple[str, ...]) -> ConfigError | None:
    """``exc`` re-worded to name the ``--set`` override(s) that caused it (a field or unknown key they set is named in
    the message), or None when none did."""
    message = str(exc)
    culprits = []
    for text in overrides:
        keys = [p for p in text.split("=", 1)[0].strip().split(".") if p]
        if not keys:
            continue
        dotted = ".".join(keys)
        parent = ".".join(keys[:-1])
        unknown_key = f"'{keys[-1]}'" in message and (not parent or message.startswith(parent))
        # a section the override reaches into that is itself unknown (model.options.x where nothing declares options)
        unknown_key |= any(
            message.startswith(f"{'.'.join(keys[:i])}: unknown key") and f"'{keys[i]}'" in message
            for i in range(1, len(keys) - 1)
        )
        if re.search(rf"(^|[\s'\[(]){re.escape(dotted)}([\s:=\[\]'.,]|$)", message) or unknown_key:
            culprits.append(text)
    if not culprits:
        return None
    return ConfigError(f"--set {' --set '.join(culprits)}: {message}")


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a preset (a file path or a shipped preset's name, with its ``base`` chain) and apply dotted overrides
    in order.

    ``head.name`` overrides apply first; switching the head drops the preset's options for the previous head, so
    ``--set head.name=clip4clip --set head.options.video_pool=mean`` works on a GARE preset in either order. A bad
    value is blamed on the ``--set`` that gave it, else on the file."""
    if path:
        path = preset_path(path)
    values: dict = _read_yaml(Path(path)) if path else {}
    return config_with_overrides(values, overrides, str(path or "<overrides>"))


def config_with_overrides(values: dict, overrides: list[str] | tuple[str, ...] = (), source: str = "config") -> Config:
    """A :class:`Config` from a nested mapping (a preset's, or the one a checkpoint carries) with dotted overrides
    applied in order (``head.name`` first, as in :func:`load_config`); errors name the ``--set`` that caused them,
    else ``source``."""
    values = copy.deepcopy(values)
    parsed = [(text, *_parse_override_for_field(text)) for text in overrides]
    for _, keys, value in parsed:
        if keys == ["head", "name"]:
            _switch_head(values, value)
    for text, keys, value in parsed:
        if keys == ["head", "name"]:
            continue
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    try:
        return config_from_dict(values)
    except ConfigError as exc:
        blamed = blame_overrides(exc, list(overrides))
        raise (blamed or ConfigError(f"{source}: {exc}")) from None


def config_to_dict(config: Any) -> dict:
    """The settings of a config (or of one of its sections) as plain values: tuples become lists, and a plug-in's
    declared settings sit beside the section's own fields."""

    def convert(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            out = {}
            for f in dataclasses.fields(v):
                value = getattr(v, f.name)
                if f.metadata.get("declared"):  # a plug-in's settings sit beside the section's fields
                    out.update({key: convert(setting) for key, setting in value.items()})
                else:
                    out[f.name] = convert(value)
            return out
        if isinstance(v, (tuple, list)):
            return [convert(x) for x in v]
        if isinstance(v, dict):
            return {k: convert(x) for k, x in v.items()}
        return copy.deepcopy(v)

    return convert(config)


def save_config(config: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config (every field) atomically."""
    from tvr.utils.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
