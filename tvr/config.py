"""Run configuration: nested dataclasses loaded from YAML presets with dotted ``--set`` overrides.

A preset may name another preset under ``base:`` (a path relative to itself); the child's keys override the
base's, recursively. Unknown keys are an error that names the key and the file, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override does not match the schema."""


@dataclass
class DataConfig:
    #: msrvtt | msvd | didemo | activitynet | generic
    dataset: str = "msrvtt"
    #: folder holding the dataset's annotation files (standard names, see docs/datasets.md)
    annotations: str = ""
    #: folder holding the video files
    video_dir: str = ""
    #: how a video id becomes a file name inside ``video_dir`` (``{video_stem}``: the id without its extension)
    video_pattern: str = "{video_id}.mp4"
    #: allow video files that resolve (after ``..`` and symlinks) outside ``video_dir``; off: such a video is skipped
    #: and listed with reason "outside video_dir" (a stray ``../x.mp4`` or absolute path in a user CSV)
    allow_outside_video_dir: bool = False
    #: MSR-VTT training list: 9k | 7k ; ignored elsewhere
    train_split: str = "9k"
    #: generic format: path of the CSV / JSONL file (relative to ``annotations``)
    generic_file: str = "captions.csv"
    #: fraction of training videos held out for validation where a dataset has no official val split
    val_fraction: float = 0.05
    val_seed: int = 0
    max_words: int = 32
    max_frames: int = 12
    #: candidate frames per second before uniform sub-sampling to ``max_frames`` (CLIP4Clip: 1)
    frame_rate: float = 1.0
    image_size: int = 224
    #: clip4clip (1-fps candidates, uniform pick, zero padding) | clipvip (linspace over decoded frames)
    sampling: str = "clip4clip"
    #: video-consistent RandAugment on training clips (GARE recipe); never applied at eval
    augment: bool = False
    augment_magnitude: float = 7.0
    augment_num_ops: int = 4
    num_workers: int = 0
    #: folder of a ``tvr features`` cache; when set, training/eval read features instead of videos
    features_dir: str = ""
    #: restrict to the first N training pairs / test items (0 = all); for smoke runs
    limit_train: int = 0
    limit_eval: int = 0


@dataclass
class TinyClipConfig:
    """A small randomly initialised CLIP of the real architecture (tests, demo, CPU experiments)."""

    embed_dim: int = 64
    text_width: int = 64
    text_layers: int = 4
    text_heads: int = 4
    vision_width: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    image_size: int = 32
    patch_size: int = 8
    context_length: int = 77
    vocab_size: int = 49408


@dataclass
class ModelConfig:
    #: "tiny" (random init from ``tiny``), a local HF CLIP directory, a hub id, or an OpenAI ``ViT-B-32.pt`` file
    clip: str = "tiny"
    tiny: TinyClipConfig = field(default_factory=TinyClipConfig)
    #: folder with the tokenizer files (vocab.json + merges.txt); empty = the checkpoint's own
    tokenizer: str = ""
    #: train only the temporal module and the head (always true when training on cached features)
    freeze_backbone: bool = False
    #: meanP | seqTransf | none
    temporal: str = "seqTransf"
    temporal_layers: int = 4
    #: on CUDA, cast a CLIP that does not train (frozen backbone, ``tvr features``, ``tvr eval``) to fp16 as the
    #: reference does; a trainable backbone keeps fp32 weights and trains under AMP instead
    clip_fp16_on_cuda: bool = True
    #: encode at most this many frames per vision forward pass (0 = all frames of the batch at once)
    frame_chunk: int = 0


@dataclass
class Clip4ClipOptions:
    """CLIP4Clip similarity (spec §1.3)."""

    #: mean (masked mean of normalised frames) | text_softmax (text-conditioned frame pooling)
    video_pool: str = "mean"
    pool_temperature: float = 3.0


@dataclass
class GareOptions:
    """GARE (spec §3). Defaults = the released MSR-VTT configuration."""

    #: text | video: which side receives Δ_ij
    corrected_side: str = "text"
    #: frames (V_frame of video j) | words (T_word of text i)
    context: str = "frames"
    #: sign η of the gap η·(v̄_j − t_i)
    eta: float = 1.0
    #: True: query = η·(v̄_j − t_i); False: Table-5 variant, query = t_i and Δ_ij = v_j − ψ(t_i, C)
    gap_query: bool = True
    #: video pooling in the score: mean | text_softmax
    video_pool: str = "text_softmax"
    pool_temperature: float = 3.0
    #: masked frame mean for v̄_j and key masking in ψ (reference: off)
    mask_frames: bool = False
    #: normal0.02 (reference behaviour) | identity
    psi_init: str = "normal0.02"
    psi_dropout: float = 0.3
    #: sum (released code, β=1e-4) | mean (paper, β=0.07)
    kl_reduction: str = "sum"
    kl_weight: float = 1e-4
    radius_weight: float = 0.01
    radius_lambda: float = 0.5
    direction_weight: float = 0.01
    direction_alpha: float = 2.0
    #: exact | fast | auto: test-time pairwise scorer (auto = the factorised scorer where it applies)
    scorer: str = "auto"
    #: two-stage evaluation: shortlist K videos per text by a dot-product score, rerank exactly (0 = exact all)
    rerank_k: int = 0


@dataclass
class HeadConfig:
    #: clip4clip | gare
    name: str = "clip4clip"
    #: None = take the backbone's logit_scale (pretrained CLIP: ln 100)
    logit_scale_init: float | None = None
    logit_scale_max: float = 4.605170185988092
    clip4clip: Clip4ClipOptions = field(default_factory=Clip4ClipOptions)
    gare: GareOptions = field(default_factory=GareOptions)


@dataclass
class TrainConfig:
    epochs: int = 5
    batch_size: int = 128
    lr: float = 1e-4
    #: backbone (CLIP) lr = lr × coef (spec §1.4: 1e-3)
    backbone_lr_coef: float = 1e-3
    weight_decay: float = 0.2
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    #: warmup_cosine | constant
    schedule: str = "warmup_cosine"
    warmup: float = 0.1
    #: when > 0, the schedule spans this many epochs regardless of ``epochs`` (the GARE reference uses 5)
    schedule_epochs: int = 0
    grad_clip: float = 1.0
    #: autocast on CUDA (bf16 where supported, else fp16 with a grad scaler); ignored on CPU
    amp: bool = True
    seed: int = 42
    device: str = "auto"
    #: intra-op CPU threads for torch (0 = torch's default); small models on a busy CPU run faster with 1
    num_threads: int = 0
    #: save a checkpoint every N optimizer steps (0 = only at epoch ends)
    checkpoint_every: int = 0
    log_every: int = 10
    #: evaluate on the validation split every N steps (0 = at epoch ends only)
    eval_every: int = 0
    #: stop after this many optimizer steps (0 = run all epochs); for smoke runs
    max_steps: int = 0
    #: select the checkpoint kept as best.pt by this validation metric
    select_metric: str = "t2v/R1"


@dataclass
class EvalConfig:
    batch_size: int = 64
    text_chunk: int = 0
    video_chunk: int = 0
    #: optimistic (rank = 1 + #strictly higher) | reference (CLIP4Clip tie expansion)
    tie_mode: str = "optimistic"
    #: also report dual-softmax (DSL) re-weighted scores as an extra column
    dsl: bool = False
    #: also report QB-Norm (dynamic inverted softmax over a query bank of training captions) as the row t2v_qbnorm
    qbnorm: bool = False
    #: also report the inverted softmax as the row t2v_invsoftmax (over the query bank when one is given, else over
    #: the evaluated queries themselves)
    inverted_softmax: bool = False
    #: β of QB-Norm and the inverted softmax (QB-Norm paper: 20)
    qbnorm_beta: float = 20.0
    #: QB-Norm activation set: gallery items among the top-k results of some bank query (QB-Norm paper: 1)
    qbnorm_k: int = 1
    #: training captions in the query bank: 0 = all of them, N = N evenly spaced ones
    query_bank_size: int = 0
    split: str = "test"


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


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
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, values: dict, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = _coerce(values[f.name], hints[f.name], f"{where}.{f.name}" if where else f.name)
    return cls(**kwargs)


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
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
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    return _merge(_read_yaml(path.parent / base, (*seen, path)), raw)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` → (["train", "lr"], 3e-4); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. train.lr=3e-4")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    return parts, value


def config_from_dict(values: dict, where: str = "config") -> Config:
    return _build(Config, values, "" if where == "config" else where)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a preset (with its ``base`` chain) and apply dotted overrides in order."""
    values: dict = _read_yaml(Path(path)) if path else {}
    for text in overrides:
        keys, value = parse_override(text)
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    try:
        return config_from_dict(values)
    except ConfigError as exc:
        raise ConfigError(f"{path or '<overrides>'}: {exc}") from None


def config_to_dict(config: Any) -> dict:
    def convert(v: Any) -> Any:
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: convert(x) for k, x in v.items()}
        return v

    return convert(dataclasses.asdict(config))


def save_config(config: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config (every field) atomically."""
    from tvr.utils.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
