"""Import checkpoints released by CLIP4Clip-family code into a tvr :class:`~tvr.models.model.RetrievalModel`.

Two layouts are understood (both are plain ``torch.save(model.state_dict())`` files; a ``"state_dict"`` /
``"model_state_dict"`` / ``"model"`` wrapper and DDP's ``module.`` prefix are removed first); a method's own part is
mapped by the :class:`ReleaseKeys` its head class names in ``release_keys`` (GARE's ψ:
:mod:`tvr.methods.gare.release_keys`), so this module knows no method:

* **CLIP4Clip** (``pytorch_model.bin``, spec §1): ``clip.*`` — the OpenAI CLIP state dict (ViT); with
  ``sim_header=seqTransf`` also ``frame_position_embeddings.weight`` and ``transformerClip.resblocks.<i>.*`` (OpenAI
  residual blocks: fused ``attn.in_proj_*``, ``attn.out_proj``, ``ln_1``, ``mlp.c_fc``, ``mlp.c_proj``, ``ln_2``).
* **GARE** (``best.pth``, spec §3): the same, plus ψ (twice, under ``agent.psi`` and its alias ``psi``); its keys,
  and those the released model never uses (reported as *ignored*, not as unexpected), are listed in
  :mod:`tvr.methods.gare.release_keys`.

Where the tensors go: ``clip.*`` through the OpenAI → HF converter (:mod:`tvr.models.backbones.clip.convert_openai`) to
``backbone.clip.*``; ``clip.logit_scale`` also to ``head.logit_scale`` (both references scale logits by
exp(clip.logit_scale)); the temporal blocks to ``temporal.blocks.<i>`` with the fused q/k/v split like CLIP's own
layers; ψ to :class:`~tvr.methods.gare.psi.Psi` (``ln_in``, ``q_proj`` … ``out_proj``, ``ln_attn``, ``linear``,
``ln_out``, ``delta_proj``). Every tensor is cast to float32 (GARE saves CLIP in fp16 on CUDA).

The model comes from the config (``tvr.models.build.build_model``), so its architecture — CLIP size
(``model.clip``), ``model.temporal`` / ``temporal_layers``, ``head.name`` — must be the one the checkpoint was trained
with; anything that does not fit is reported by key and, unless ``partial=True``, refused. Writing the result as a
tvr checkpoint is the caller's job (``tvr import-checkpoint`` uses ``tvr.train.checkpoint.save_checkpoint``), so
this module does not depend on the training package.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tvr.models.backbones.clip.convert_openai import (
    METADATA_KEYS,
    ConversionError,
    count_blocks,
    map_residual_block,
    map_state_dict,
)
from tvr.models.model import RetrievalModel
from tvr.utils.errors import UserError
from tvr.utils.io import describe_file_start
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, load_torch_file

if TYPE_CHECKING:
    from tvr.models.run_spec import RunSpec

#: the layout of a release that holds the CLIP and temporal weights alone; a method whose head declares
#: ``release_keys`` adds its own layout (GARE: ``gare``, ψ)
CLIP4CLIP = "clip4clip"
_WRAPPERS = ("state_dict", "model_state_dict", "model")


class CheckpointImportError(UserError, ValueError):
    """A release checkpoint cannot be read or does not fit the model the config describes."""


@dataclasses.dataclass(frozen=True)
class ReleaseKeys:
    """How a method's part of its authors' released checkpoint maps onto its head (the module a head class names in
    ``release_keys`` defines one as ``RELEASE_KEYS``). ``layout``: the release's name (``--layout``, the report);
    ``part``: what the part is called in messages; ``prefixes``: where the release stores the part, in order of
    preference (further ones are aliases that must hold equal tensors, reported as ignored); ``key_map``: source key
    after the prefix → key under ``target``; ``ignored``: source keys the released model never uses;
    ``missing_hint`` / ``unexpected_hint``: what a report says when the model's part is missing from the checkpoint /
    the checkpoint's part has no place in the model."""

    layout: str
    part: str
    prefixes: tuple[str, ...]
    key_map: dict[str, str]
    target: str
    ignored: re.Pattern[str]
    missing_hint: str
    unexpected_hint: str


def release_keys() -> list[ReleaseKeys]:
    """The release key maps the registered heads declare (``RetrievalHead.release_keys``)."""
    from tvr.models.heads.registry import available_heads, head_class

    found = []
    for name in available_heads():
        cls = head_class(name)
        module_name = cls.release_keys
        if not module_name:
            continue
        module = importlib.import_module(module_name, cls.__module__.rpartition(".")[0] or None)
        keys = getattr(module, "RELEASE_KEYS", None)
        if not isinstance(keys, ReleaseKeys):
            raise TypeError(f"{cls.__name__}.release_keys = {module_name!r}: {module.__name__} has no RELEASE_KEYS")
        if keys not in found:
            found.append(keys)
    return found


def layouts() -> tuple[str, ...]:
    """Every release layout understood: CLIP4Clip's and the registered methods' own."""
    return (CLIP4CLIP, *(keys.layout for keys in release_keys()))


@dataclasses.dataclass
class ImportReport:
    """What happened to every key. ``mapped``: (source key, tvr key) pairs (a fused in_proj gives three);
    ``missing``: tvr keys no source tensor filled (they keep the values ``build_model`` gave them);
    ``unexpected``: source keys with no place in the model; ``ignored``: source keys the released model never uses
    (and ψ's duplicate alias); ``mismatched``: tvr keys whose source tensor has another shape (not loaded)."""

    source: str
    layout: str
    mapped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)
    mismatched: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "layout": self.layout,
            "mapped": [list(pair) for pair in self.mapped],
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "ignored": list(self.ignored),
            "mismatched": list(self.mismatched),
        }

    def summary(self, limit: int = 10) -> str:
        def show(items: list[str]) -> str:
            if not items:
                return "none"
            head = ", ".join(items[:limit])
            return head + (f", … ({len(items)} in all)" if len(items) > limit else "")

        return (
            f"{self.source} ({self.layout} layout): {len(self.mapped)} tensors mapped; "
            f"missing [{show(self.missing)}]; unexpected [{show(self.unexpected)}]; "
            f"shape mismatches [{show(self.mismatched)}]; ignored (unused by the released model) "
            f"[{show(self.ignored)}]"
        )


# --------------------------------------------------------------------------------------------- reading


def load_release_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a released ``pytorch_model.bin`` / ``best.pth`` as a flat dict of tensors (on CPU, weights only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointImportError(f"checkpoint not found: {path}")
    expected = "a torch.save-d state dict such as CLIP4Clip's pytorch_model.bin or GARE's best.pth"
    try:
        obj: Any = load_torch_file(path)
    except PickleRefusedError as exc:
        raise CheckpointImportError(str(exc)) from None
    except TorchFileError as exc:
        raise CheckpointImportError(
            f"{path}: not a readable PyTorch checkpoint: {describe_file_start(path)}; expected {expected}"
        ) from exc
    for _ in range(2):  # {"state_dict": {...}} and similar wrappers, possibly nested once
        if isinstance(obj, dict) and not any(isinstance(v, Tensor) for v in obj.values()):
            inner = next((obj[k] for k in _WRAPPERS if isinstance(obj.get(k), dict)), None)
            if inner is not None:
                obj = inner
    if not isinstance(obj, dict):
        raise CheckpointImportError(f"{path}: holds a {type(obj).__name__}; expected {expected} (name -> tensor)")
    if not obj:
        raise CheckpointImportError(f"{path}: holds an empty dict; expected {expected} (name -> tensor)")
    state = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not state:
        kinds = sorted({type(v).__name__ for v in obj.values()})
        raise CheckpointImportError(
            f"{path}: a dict of {len(obj)} entries but no tensor among them (entries are {', '.join(kinds)}; first "
            f"keys {sorted(map(str, obj))[:5]}); expected {expected} (name -> tensor)"
        )
    if all(k.startswith("module.") for k in state):  # saved from a DistributedDataParallel wrapper
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def detect_layout(state: dict[str, Tensor]) -> str:
    """A method's layout when its part's keys are present (``gare``: ψ), ``clip4clip`` when only CLIP (+ temporal)
    keys are; else an error."""
    for keys in release_keys():
        if any(k.startswith(keys.prefixes) for k in state):
            return keys.layout
    if any(k.startswith("clip.") for k in state):
        return CLIP4CLIP
    raise CheckpointImportError(
        f"no 'clip.*' keys: not a CLIP4Clip/GARE release state dict (first keys: {sorted(state)[:5]})"
    )


# --------------------------------------------------------------------------------------------- mapping


def _part_source(state: dict[str, Tensor], keys: ReleaseKeys, report: ImportReport) -> str | None:
    """The prefix to read a method's part from (GARE's ψ); another alias must hold the same tensors and is reported
    as ignored."""
    present = [p for p in keys.prefixes if any(k.startswith(p) for k in state)]
    if not present:
        return None
    chosen = present[0]
    for other in present[1:]:
        for key in [k for k in state if k.startswith(other)]:
            twin = chosen + key[len(other) :]
            if twin in state and not torch.equal(state[twin], state[key]):
                raise CheckpointImportError(
                    f"{key} differs from {twin}; expected the same {keys.part} under both names"
                )
            report.ignored.append(key)
    return chosen


def map_release_state_dict(
    state: dict[str, Tensor], target_keys: dict[str, torch.Size], layout: str | None = None, source: str = ""
) -> tuple[dict[str, Tensor], ImportReport]:
    """Map a release state dict onto tvr keys. ``target_keys``: the model's ``{key: shape}``.

    Returns the float32 tensors to load (only keys the model has, with matching shapes) and the report.
    """
    layout = layout or detect_layout(state)
    methods = release_keys()
    if layout not in (CLIP4CLIP, *(keys.layout for keys in methods)):
        raise CheckpointImportError(f"layout {layout!r}: expected one of {layouts()}")
    report = ImportReport(source=source, layout=layout)
    used: set[str] = set()
    out: dict[str, Tensor] = {}
    pairs: list[tuple[str, str]] = []

    def take_from(key: str) -> Tensor:
        if key not in state:
            raise CheckpointImportError(f"checkpoint has no '{key}'")
        used.add(key)
        return state[key].float()

    def put(src: str, dst: str, value: Tensor) -> None:
        out[dst] = value
        pairs.append((src, dst))

    # CLIP: clip.<OpenAI key> → backbone.clip.<HF key>, through the OpenAI converter's exact key map
    clip = {k[len("clip.") :]: v for k, v in state.items() if k.startswith("clip.")}
    if not clip:
        raise CheckpointImportError("no 'clip.*' keys: the checkpoint holds no CLIP weights")
    origins: dict[str, str] = {}
    try:
        hf, clip_used = map_state_dict(
            clip,
            count_blocks(clip, "transformer.resblocks."),
            count_blocks(clip, "visual.transformer.resblocks."),
            origins,
        )
    except ConversionError as exc:
        raise CheckpointImportError(f"CLIP part (clip.*): {exc}") from None
    for dst, value in hf.items():
        put("clip." + origins[dst], "backbone.clip." + dst, value)
    used.update("clip." + k for k in clip_used)
    used.update("clip." + k for k in METADATA_KEYS if k in clip)
    if "clip.logit_scale" in state:
        put("clip.logit_scale", "head.logit_scale", take_from("clip.logit_scale"))

    # temporal: frame positions and the seqTransf blocks (OpenAI block layout, fused q/k/v)
    if "frame_position_embeddings.weight" in state:
        key = "frame_position_embeddings.weight"
        put(key, "temporal." + key, take_from(key))
    blocks = sorted({int(m.group(1)) for k in state if (m := re.match(r"^transformerClip\.resblocks\.(\d+)\.", k))})
    for i in blocks:
        block_origins: dict[str, str] = {}
        mapped = map_residual_block(
            take_from, f"transformerClip.resblocks.{i}.", f"temporal.blocks.{i}.", block_origins
        )
        for dst, value in mapped.items():
            put(block_origins[dst], dst, value)

    # the methods' own parts (GARE's ψ)
    for keys in methods:
        prefix = _part_source(state, keys, report)
        if prefix is not None:
            for src_key, dst_key in keys.key_map.items():
                if prefix + src_key in state:
                    put(prefix + src_key, keys.target + dst_key, take_from(prefix + src_key))

    # bookkeeping: what the model lacks, what the checkpoint had no place for
    for src, dst in pairs:
        if dst not in target_keys:
            report.unexpected.append(src)
            out.pop(dst, None)
        elif tuple(out[dst].shape) != tuple(target_keys[dst]):
            report.mismatched.append(
                f"{dst} (from {src}): checkpoint {tuple(out[dst].shape)} vs model {tuple(target_keys[dst])}"
            )
            out.pop(dst, None)
        else:
            report.mapped.append((src, dst))
    ignored = set(report.ignored)
    for key in sorted(state):
        if key in used or key in ignored:
            continue
        if any(keys.ignored.match(key) for keys in methods):
            report.ignored.append(key)
        else:
            report.unexpected.append(key)
    report.missing = sorted(set(target_keys) - set(out))
    report.unexpected = sorted(set(report.unexpected))
    report.ignored = sorted(set(report.ignored))
    return out, report


def import_release_checkpoint(
    path: str | os.PathLike, run: RunSpec, layout: str | None = None, partial: bool = False
) -> tuple[RetrievalModel, ImportReport]:
    """Build the model of ``run`` (:func:`tvr.models.run_spec.resolve_run`) and load a CLIP4Clip / GARE release
    checkpoint into it.

    Raises :class:`CheckpointImportError` (with the report's summary) when any model tensor stays unfilled, any
    checkpoint tensor has no place, or shapes disagree — unless ``partial``, which loads what fits and leaves the
    rest at ``build_model``'s values (e.g. CLIP4Clip weights under a fresh GARE ψ).
    """
    from tvr.models.build import build_model

    state = load_release_state_dict(path)
    model = build_model(run)
    own = model.state_dict()
    tensors, report = map_release_state_dict(
        state, {k: v.shape for k, v in own.items()}, layout=layout, source=str(path)
    )
    if not report.complete and not partial:
        hints = []
        for keys in release_keys():
            if any(k.startswith(keys.target) for k in report.missing):
                hints.append(keys.missing_hint)
            if any(k.startswith(keys.prefixes) for k in report.unexpected):
                hints.append(keys.unexpected_hint)
        if any(k.startswith(("transformerClip.", "frame_position")) for k in report.unexpected):
            hints.append("the checkpoint has seqTransf blocks the model lacks: check model.temporal / temporal_layers")
        if any(k.startswith("temporal.") for k in report.missing):
            hints.append(
                "the model's temporal module has weights the checkpoint lacks: check model.temporal / "
                "temporal_layers (a meanP checkpoint has none)"
            )
        if report.mismatched:
            hints.append("shapes differ: model.clip must name the CLIP the checkpoint was trained from")
        raise CheckpointImportError(
            report.summary() + (" — " + "; ".join(hints) if hints else "") + " (pass --partial to load what fits and "
            "keep the built model's values elsewhere)"
        )
    with torch.no_grad():
        for key, value in tensors.items():
            own[key].copy_(value.to(own[key].dtype))
    return model, report


__all__ = [
    "CLIP4CLIP",
    "CheckpointImportError",
    "ReleaseKeys",
    "ImportReport",
    "detect_layout",
    "import_release_checkpoint",
    "layouts",
    "load_release_state_dict",
    "map_release_state_dict",
]
