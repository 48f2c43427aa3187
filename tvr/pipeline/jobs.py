"""The train and eval jobs behind the CLI: config resolution, the run folder, training with validation-based
selection and a single final test, evaluation of a checkpoint."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tvr.config import Config, ConfigError, save_config
from tvr.models.build import check_image_size
from tvr.models.run_spec import RunSpec, resolve_run
from tvr.pipeline.preflight import preflight
from tvr.pipeline.run_folder import (
    RESUME_AUTO,
    RunFolderError,
    StartUndo,
    check_run_folder,
    clear_run_state,
    record_config,
    resume_changes,
    sweep_temporaries,
)
from tvr.utils.device import resolve_device
from tvr.utils.distributed import barrier, is_main_process
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_json
from tvr.utils.lock import folder_lock
from tvr.utils.parallel import loader_workers
from tvr.utils.torch_files import load_torch_file

if TYPE_CHECKING:
    from tvr.utils.process_group import DistInfo


log = logging.getLogger(__name__)

#: the config an evaluation ran with, written into its ``--out`` folder
EVAL_CONFIG = "eval_config.yaml"


def resolve_config(cfg: Config) -> Config:
    """``cfg`` resolved, as a new config (``cfg`` is not changed): what the config layer cannot check alone checked
    (the head name and its options, the backbone's settings), ``head.options`` and the backbone's sections as their
    dataclasses, and the preprocessing the config leaves to the backbone (``data.image_size``, ``data.sampling``,
    the pixel normalisation) filled in. Resolving a resolved config gives an equal one; raises ConfigError naming
    the field. The config of :func:`tvr.models.run_spec.resolve_run`, which jobs use to keep the whole description."""
    return resolve_run(cfg).config


@contextlib.contextmanager
def torch_threads(cfg: Config) -> Iterator[None]:
    """Use ``train.num_threads`` intra-op threads inside the block and restore the caller's setting after."""
    previous = torch.get_num_threads()
    if cfg.train.num_threads > 0:
        torch.set_num_threads(cfg.train.num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class SplitEvaluator:
    """Encodes one evaluation split (from videos or from the feature cache) and ranks it. ``select_inference``
    (the validation split) lets a head with inference candidates choose its setting on this split.

    ``distributed`` (under torchrun; every rank builds one and calls it together): each rank encodes its share of
    the videos and captions and scores its share of the captions; features and score rows are all-gathered, so every
    rank gets the metrics of one process (:mod:`tvr.eval.sharding`), and chooses the same inference setting. The
    query-bank rows (``eval.qbnorm`` / ``eval.inverted_softmax``) are computed by rank 0 alone."""

    def __init__(
        self,
        cfg: Config,
        split_name: str,
        tokenizer=None,
        select_inference: bool = False,
        split: Any = None,
        distributed: bool = False,
    ) -> None:
        from tvr.data.annotations import load_split

        self.cfg = cfg
        self.select_inference = select_inference
        self.distributed = distributed
        self.split = split if split is not None else load_split(cfg.data, split_name)
        self.tokenizer = tokenizer
        self.cached = None
        if cfg.data.features_dir:
            from tvr.data.feature_cache import load_cached_split

            self.cached = load_cached_split(cfg.data.features_dir, split_name)

    def encode(self, model, device: torch.device):
        """Every caption and (readable) video of the split through ``model`` (eval mode): an ``EncodedSplit``."""
        from tvr.eval.runner import encode_split_cached, encode_split_raw

        if self.cached is not None:
            return encode_split_cached(model, self.split, self.cached, self.cfg, device, distributed=self.distributed)
        return encode_split_raw(model, self.split, self.tokenizer, self.cfg, device, distributed=self.distributed)

    def __call__(self, model, device: torch.device | None = None) -> dict:
        from tvr.eval.runner import evaluate_encoded, training_query_bank

        device = device or next(model.parameters()).device
        was_training = model.training
        encoded = self.encode(model, device)
        # QB-Norm / inverted softmax: training captions encoded by this model (re-encoded: the model changes)
        bank = None
        if not self.distributed or is_main_process():
            bank = training_query_bank(model, self.cfg, device, self.tokenizer)
        metrics = evaluate_encoded(
            model,
            encoded,
            self.cfg,
            device,
            select_inference=self.select_inference,
            query_bank=bank,
            distributed=self.distributed,
        )
        model.train(was_training)
        return metrics


def _train_data(cfg: Config, out_dir: Path, tokenizer, rank: int, world_size: int, split: Any):
    from tvr.data.annotations import describe_split_source
    from tvr.train.trainer import DatasetTrainData

    atomic_write_json(out_dir / "splits.json", describe_split_source(cfg.data))
    if cfg.data.features_dir:
        from tvr.data.feature_cache import CachedPairDataset, collate_cached, load_cached_split

        cached = load_cached_split(cfg.data.features_dir, "train")
        dataset = CachedPairDataset(cached, [split.videos[k] for k in split.text_video])
        if dataset.skipped:
            atomic_write_json(
                out_dir / "skipped_videos_cache.json", {"count": len(dataset.skipped), "videos": dataset.skipped}
            )
        collate = collate_cached
    else:
        from tvr.data.datasets import PairDataset, VideoResolver, collate_pairs

        resolver = VideoResolver.from_config(cfg.data)
        # pixels as the backbone expects them: the resolved data config carries its size, sampling and normalisation
        dataset = PairDataset(split.records, tokenizer, resolver, cfg.data, train=True, seed=cfg.train.seed)
        collate = collate_pairs
    if len(dataset) < cfg.train.batch_size:
        raise ConfigError(
            f"training split has {len(dataset)} pairs, fewer than train.batch_size={cfg.train.batch_size}"
        )
    return DatasetTrainData(
        dataset,
        batch_size=cfg.train.batch_size // world_size,
        collate_fn=collate,
        seed=cfg.train.seed,
        num_workers=loader_workers(cfg.data.num_workers),
        drop_last=True,
        rank=rank,
        world_size=world_size,
        worker_ignored_signals=cfg.train.preemption_signals,
    )


def run_train(
    cfg: Config,
    out_dir: str | Path,
    resume: bool | str = False,
    final_test: bool = True,
    overwrite: bool = False,
    small_val_reason: str | None = None,
) -> dict[str, Any]:
    """Train, select on validation, then evaluate the test split once (last and best checkpoints).

    A folder holding an earlier run's checkpoints needs ``resume`` (continue it) or ``overwrite`` (start over);
    ``resume="auto"`` continues the run when the folder holds ``last.pt`` and starts one otherwise, so the same call
    serves a first launch and every restart. A preemption signal during training writes ``last.pt`` and raises
    :class:`PreemptedError` (the command line exits with :data:`PREEMPTED_EXIT_CODE`). ``small_val_reason``: why the
    caller chose a small validation split, said in place of the warning (:func:`tvr.pipeline.preflight.preflight`)."""
    run = resolve_run(cfg)
    check_run_folder(Path(out_dir), resume, overwrite)
    with torch_threads(run.config):
        return _run_train(run, out_dir, resume, final_test, overwrite, small_val_reason)


def _run_train(
    run: RunSpec,
    out_dir: str | Path,
    resume: bool | str,
    final_test: bool,
    overwrite: bool,
    small_val_reason: str | None = None,
) -> dict[str, Any]:
    from tvr.utils.distributed import all_gather_object, is_main_process
    from tvr.utils.process_group import distributed_job

    cfg = run.config
    # first: a device this machine lacks fails before the run folder exists. Under torchrun the job has returned
    # (its model and DDP wrapper freed) before the process group it joined is destroyed.
    with distributed_job(cfg.train.device) as dist:
        out_dir = Path(out_dir)
        # every split parsed, the video folder and the validation videos checked: fail in seconds, not after training
        checked = preflight(
            run, out_dir, final_test=final_test, progress=is_main_process(), small_val_reason=small_val_reason
        )
        created = not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        # one job per run folder: the main process holds the lock for all ranks of a torchrun job, decides whether
        # this start resumes, and every rank learns both (else the other ranks would wait in the first collective)
        with contextlib.ExitStack() as held:
            refusal: BaseException | None = None
            undo = resuming = None
            if is_main_process():
                # entered before the lock, so it runs after the lock is released (and its file gone)
                undo = held.enter_context(StartUndo(out_dir, created_folder=created))
                try:
                    held.enter_context(folder_lock(out_dir, "run folder"))
                    resuming = _prepare_run_folder(cfg, out_dir, resume, overwrite, undo)
                except (UserError, OSError) as exc:
                    refusal = exc
            decisions = all_gather_object((None if refusal is None else str(refusal), resuming))
            if refusal is not None:
                raise refusal
            if decisions[0][0] is not None:
                raise RunFolderError(f"the main process could not take the run folder: {decisions[0][0]}")
            return _train_and_test(run, out_dir, bool(decisions[0][1]), final_test, dist, checked, undo)


def _prepare_run_folder(cfg: Config, out_dir: Path, resume: bool | str, overwrite: bool, undo: StartUndo) -> bool:
    """Under the folder's lock, before anything of this run is written: check again what the folder holds, clear
    an earlier run's state for ``overwrite``, check a resume against the folder's record, then write the record.
    Returns whether this start resumes."""
    resuming = check_run_folder(out_dir, resume, overwrite)
    changes = resume_changes(cfg, out_dir) if resuming else {}
    if overwrite:
        removed = clear_run_state(out_dir)
        if removed:
            log.info("--overwrite: removed the earlier run's %s from %s", ", ".join(removed), out_dir)
    # temporaries of a run killed mid-write (nothing of this run is being written yet)
    for leftover in sweep_temporaries(out_dir):
        log.info("removed a leftover temporary of an interrupted run: %s", leftover)
    if resume == RESUME_AUTO:
        log.info("--resume auto: %s", f"continuing {out_dir / 'last.pt'}" if resuming else "starting a new run")
    undo.record()
    record_config(cfg, out_dir, changes, _checkpoint_step(out_dir / "last.pt") if changes else None)
    return resuming


def _checkpoint_step(path: Path) -> int | None:
    try:
        return int(load_torch_file(path, mmap=True)["state"]["global_step"])
    except Exception:  # noqa: BLE001 - only for the record; the resume itself reports an unreadable checkpoint
        return None


def _train_and_test(
    run: RunSpec,
    out_dir: Path,
    resume: bool,
    final_test: bool,
    dist: DistInfo,
    checked: Any,
    undo: StartUndo | None,
) -> dict[str, Any]:
    from tvr.data.tokenizer import build_tokenizer
    from tvr.models.build import build_model
    from tvr.train.checkpoint import load_checkpoint
    from tvr.train.trainer import Trainer, seed_everything
    from tvr.train.utils import to_jsonable

    cfg = run.config
    seed_everything(cfg.train.seed)
    if cfg.data.features_dir:
        from tvr.data.feature_cache import check_cache_matches, read_manifest

        check_cache_matches(cfg, run.features, read_manifest(cfg.data.features_dir))
    tokenizer = None if cfg.data.features_dir else build_tokenizer(run.tokenizer, out_dir)
    model = build_model(run, cached=bool(cfg.data.features_dir))
    if model.backbone is not None and cfg.model.freeze_backbone:
        model.backbone.maybe_half(dist.device)
    train_data = _train_data(cfg, out_dir, tokenizer, dist.rank, dist.world_size, checked.splits["train"])
    # under torchrun every rank takes part in validation and the final test (sharded evaluation)
    validator = SplitEvaluator(
        cfg, "val", tokenizer, select_inference=True, split=checked.splits["val"], distributed=dist.distributed
    )
    trainer = Trainer(model, cfg, train_data, out_dir, evaluate_fn=validator, dist_info=dist)
    try:
        summary = trainer.fit(resume=resume)
    finally:
        if trainer.started and undo is not None:
            undo.keep()  # what the run wrote from here on is its own, failed or not

    summary["preflight_warnings"] = checked.warnings
    if final_test:
        barrier()  # rank 0 has written last.pt / best.pt before any rank reads them
        tester = SplitEvaluator(cfg, "test", tokenizer, split=checked.splits["test"], distributed=dist.distributed)
        summary["test"] = {}
        model = trainer.model
        for tag in ("last", "best"):
            ckpt = out_dir / f"{tag}.pt"
            if not ckpt.is_file():
                continue
            load_checkpoint(ckpt, model)
            metrics = tester(model)
            if is_main_process():
                write_eval(out_dir / f"test_{tag}", metrics, {"checkpoint": str(ckpt), "split": "test"})
            summary["test"][tag] = metrics
    if is_main_process():
        atomic_write_json(out_dir / "summary.json", to_jsonable(summary))
    return summary


def run_eval(cfg: Config, checkpoint: str | Path, out_dir: str | Path) -> dict:
    """Evaluate ``checkpoint`` on ``eval.split`` into ``out_dir``. Under torchrun every rank encodes and scores its
    share of the split (sharded evaluation) and rank 0 writes the results."""
    from tvr.utils.process_group import distributed_job

    run = resolve_run(cfg)
    resolve_device(run.config.train.device)  # first: a device this machine lacks fails before out_dir is written
    if not run.config.data.features_dir:
        check_image_size(run)
    with torch_threads(run.config), distributed_job(run.config.train.device) as dist:
        return _run_eval(run, checkpoint, out_dir, dist)


def _run_eval(run: RunSpec, checkpoint: str | Path, out_dir: str | Path, dist: DistInfo) -> dict:
    from tvr.data.tokenizer import build_tokenizer

    cfg = run.config
    device = dist.device
    out_dir = Path(out_dir)
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # its own record, never a run's config.yaml: --out may well be the run folder the checkpoint came from
        save_config(cfg, out_dir / EVAL_CONFIG)
    tokenizer = None if cfg.data.features_dir else build_tokenizer(run.tokenizer, Path(checkpoint).parent)
    model = load_model_for_eval(run, checkpoint)
    model.to(device)
    if model.backbone is not None:
        model.backbone.maybe_half(device)
    metrics = SplitEvaluator(cfg, cfg.eval.split, tokenizer, distributed=dist.distributed)(model, device)
    if dist.is_main:
        write_eval(out_dir, metrics, {"checkpoint": str(checkpoint), "split": cfg.eval.split})
    return metrics


def load_model_for_eval(cfg: Config | RunSpec | None, checkpoint: str | Path):
    """The model of ``checkpoint`` with its weights (``cfg``, a config or a resolved run, overrides the config the
    checkpoint carries; see :func:`tvr.models.checkpoint.load_model`)."""
    from tvr.models.checkpoint import load_model

    return load_model(checkpoint, cfg)[0]


def write_eval(out_dir: Path, metrics: dict, extra: dict) -> None:
    from tvr.eval.report import write_metrics

    info = dict(metrics.get("info", {}))
    info.update(extra)
    skipped = info.get("skipped_videos", [])
    if skipped:
        atomic_write_json(Path(out_dir) / "skipped_videos.json", {"count": len(skipped), "videos": skipped})
    write_metrics(out_dir, {k: v for k, v in metrics.items() if k != "info"}, info)
