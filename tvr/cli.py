"""``tvr`` command line: train, eval, features, synth, demo, and checkpoint/tokenizer conversion."""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from tvr.utils.errors import UserError

console = Console(stderr=True)
#: ``--debug`` (or TVR_DEBUG=1): let user errors show their traceback as well
_DEBUG = {"on": os.environ.get("TVR_DEBUG", "") not in ("", "0")}
#: OS errors about a path the user gave (a missing folder, a file where a folder belongs, no permission)
_PATH_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
CONFIG_HELP = "YAML file or shipped preset name, e.g. gare/msrvtt (`tvr presets` lists them)."


#: a full disk (or quota): the machine's state, not a bug; every file is written whole or not at all
_DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
#: what a command interrupted by Ctrl-C leaves, when it says nothing more specific
INTERRUPTED = ("interrupted: everything finished so far is kept (every file is written whole or not at all); "
               "rerun the same command to continue")


def say(label: str, text: str, style: str = "red") -> None:
    """Print ``label: text`` on stderr as one logical line. ``text`` is the user's or an exception's text, never
    console markup: it is escaped, so ``[...]`` (ranges, key lists, paths) prints as written."""
    # soft_wrap: one logical line (the terminal may still fold it), so paths stay copyable
    console.print(f"[{style}]{label}:[/{style}] {escape(text)}", highlight=False, soft_wrap=True)


def _is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, (UserError, *_PATH_ERRORS)) or (isinstance(exc, OSError) and exc.errno in _DISK_FULL)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        where = f" writing {exc.filename}" if exc.filename else ""
        return (f"no space left on the device{where} ({exc.strerror or exc}); nothing already written was lost (every "
                "file is written whole or not at all, a half-written one is removed): free some space and rerun "
                "(tvr train: with --resume)")
    if isinstance(exc, OSError) and not isinstance(exc, UserError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; a user error prints one or two lines and exits with code 2 (bugs keep their traceback);
    Ctrl-C says what was kept and exits with code 130."""

    @functools.wraps(fn)
    def run_command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            if _DEBUG["on"]:
                raise
            say("interrupted", INTERRUPTED.removeprefix("interrupted: "), "yellow")
            raise typer.Exit(130) from None
        except Exception as exc:
            if _DEBUG["on"] or not _is_user_error(exc):
                raise
            say("error", _describe(exc))
            console.print("[dim](--debug or TVR_DEBUG=1 shows the traceback)[/dim]")
            raise typer.Exit(2) from None

    return run_command


def out_folder(path: Path, flag: str = "--out") -> Path:
    """``path`` must be a folder or not exist yet: the one wording of every command's folder argument."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: is a file; expected a folder (existing or new)")
    return path


def out_file(path: Path, flag: str = "--out") -> Path:
    """``path`` must be a file or not exist yet."""
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder; expected a file (existing or new)")
    return path


class _Commands(typer.Typer):
    """Every command registered on the app reports user errors without a traceback."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, **kwargs)
        return lambda fn: register(friendly_errors(fn))


app = _Commands(
    add_completion=False,
    no_args_is_help=True,
    help="Text-video retrieval: train, evaluate, cache features, synthesise data.",
)


def _checked_config(make: Callable[[], Any], overrides: list[str] | None = None):
    """Build a run config with ``make`` and fully check it (core sections first, without importing torch; then the
    head's options against its own dataclass). A bad value exits with code 2 and one line naming the field and the
    valid values (and the ``--set`` that gave it)."""
    from tvr.config import ConfigError, blame_overrides

    try:
        cfg = make()
        from tvr.pipeline import resolve_config

        try:
            return resolve_config(cfg)
        except ConfigError as exc:  # a head option: name the --set that gave it
            raise blame_overrides(exc, overrides or []) or exc from None
    except ConfigError as exc:
        if _DEBUG["on"]:
            raise
        say("config error", str(exc))
        raise typer.Exit(2) from None


def _load(config: str | Path | None, overrides: list[str] | None):
    """A preset (file or shipped name) with ``--set`` overrides, checked."""
    from tvr.config import load_config

    return _checked_config(lambda: load_config(config, overrides or []), overrides)


def _load_from_checkpoint(checkpoint: Path, overrides: list[str] | None):
    """The config a checkpoint carries, with ``--set`` overrides applied, checked."""
    from tvr.config import config_with_overrides
    from tvr.models.checkpoint import CheckpointError, checkpoint_config_values

    values = checkpoint_config_values(checkpoint)
    if values is None:
        raise CheckpointError(
            f"{checkpoint}: this checkpoint carries no config (written before checkpoints carried one); pass the "
            "run's config with --config (the run folder's config.yaml)"
        )
    source = f"{checkpoint} (the config it carries)"
    return _checked_config(lambda: config_with_overrides(values, overrides or [], source), overrides)


def _print_metrics(metrics: dict, title: str) -> None:
    from tvr.eval.report import metrics_table

    console.print(f"\n[bold]{escape(title)}[/bold]")
    print(metrics_table({k: v for k, v in metrics.items() if k != "info"}))
    skipped = metrics.get("info", {}).get("skipped_videos") or []
    if skipped:
        say(f"{len(skipped)} unreadable video(s) left out", ", ".join(str(s["id"]) for s in skipped[:10])
            + (f", … ({len(skipped)} in all)" if len(skipped) > 10 else ""), "yellow")


@app.callback()
def main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of user errors (bad config, files, …)."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # decided per invocation (an app invoked twice in one process must not keep the first one's --debug)
    _DEBUG["on"] = debug or os.environ.get("TVR_DEBUG", "") not in ("", "0")


@app.command()
def train(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder (config, logs, checkpoints, metrics)."),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override, e.g. --set train.lr=3e-4 (repeatable)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/last.pt exactly where it stopped."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over in a run folder that holds checkpoints."),
    no_test: bool = typer.Option(False, "--no-test", help="Skip the final test-split evaluation."),
) -> None:
    """Train a method; select on validation; evaluate the test split once at the end."""
    out_folder(out)
    cfg = _load(config, set_)
    from tvr.pipeline import run_train

    try:
        summary = run_train(cfg, out, resume=resume, final_test=not no_test, overwrite=overwrite)
    except KeyboardInterrupt:
        if _DEBUG["on"]:
            raise
        say("interrupted", _train_interrupted(out), "yellow")
        raise typer.Exit(130) from None
    for tag, metrics in summary.get("test", {}).items():
        _print_metrics(metrics, f"test ({tag} checkpoint)")
    console.print(f"run folder: {escape(str(out))}", highlight=False)


def _train_interrupted(out: Path) -> str:
    """What an interrupted ``tvr train`` left, and how to continue it."""
    last = out / "last.pt"
    try:
        import torch

        state = torch.load(last, map_location="cpu", mmap=True, weights_only=True)["state"]
        where = f"step {state['global_step']}, epoch {state['epoch'] + 1} batch {state['batch_in_epoch']}"
    except FileNotFoundError:
        return (f"stopped before the first checkpoint: {out} holds no last.pt, so there is nothing to resume; rerun "
                "the command to start again")
    except Exception:  # noqa: BLE001 - only for the message
        where = "its position unreadable"
    return (f"{last} ({where}) is kept, with the logs up to it; the same command with --resume continues from it "
            "exactly where it stopped")


@app.command("eval")
def eval_(
    checkpoint: Path = typer.Option(..., "--checkpoint", exists=True, dir_okay=False),
    out: Path = typer.Option(..., "--out", "-o"),
    config: str | None = typer.Option(
        None, "--config", "-c", help="Default: the config the checkpoint carries. " + CONFIG_HELP
    ),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override of the config (repeatable)."),
) -> None:
    """Evaluate a checkpoint: writes OUT/metrics.json ({"t2v": ..., "v2t": ...}), OUT/metrics.md and the config it
    ran with, OUT/eval_config.yaml (OUT may be the run folder: its config.yaml is never touched)."""
    out_folder(out)
    cfg = _load(config, set_) if config else _load_from_checkpoint(checkpoint, set_)
    from tvr.pipeline import run_eval

    metrics = run_eval(cfg, checkpoint, out)
    _print_metrics(metrics, f"{cfg.eval.split} split")


@app.command()
def analyze(
    checkpoint: Path = typer.Option(..., "--checkpoint", exists=True, dir_okay=False, help="A tvr checkpoint."),
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the figures (PNG + JSON each, analysis.json)."),
    split: str = typer.Option("val", "--split", help="Split to analyse: val (default) | test | test_multi | train."),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override, e.g. --set train.device=cpu (repeatable)."),
) -> None:
    """The papers' analyses of a checkpoint's head on one split (docs/analysis.md): score distributions and ranks for
    every head; gradient tension and Δ geometry (GARE), the γ sweep and proxy space (TV-ProxyNet), uncertainty
    (GraviAlign)."""
    out_folder(out)
    cfg = _load(config, set_)
    from tvr.pipeline.analyze import run_analyze

    manifest = run_analyze(cfg, checkpoint, out, split=split)
    console.print(f"{len(manifest['figures'])} figures of {manifest['head']} on the {manifest['split_label']}:")
    for figure in manifest["figures"]:
        console.print(escape(f"  {out / figure['png']}  {figure['title']}"), highlight=False, soft_wrap=True)


@app.command()
def plot(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders written by tvr train (several: overlaid)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the figures (PNG + JSON + CSV each)."),
) -> None:
    """Training curves of run folders: every logged loss component, learning rates, validation R@1/5/10 and the
    chosen inference setting against the step (epochs on a second axis)."""
    from tvr.analysis import plot_runs

    out_folder(out)
    manifest = plot_runs(run_dirs, out)
    for figure in manifest["figures"]:
        console.print(escape(f"{out / figure['png']}  {figure['title']}"), highlight=False, soft_wrap=True)
    if manifest["skipped"]:
        console.print(f"[dim]nothing to plot for: {escape(', '.join(map(str, manifest['skipped'])))}[/dim]")


@app.command()
def features(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Cache folder; rerun to resume."),
    splits: str = typer.Option("train,val,test", help="Comma-separated splits to cache."),
    set_: list[str] = typer.Option(None, "--set"),
    shard_size: int = typer.Option(1024, help="Items per shard file."),
    fp32: bool = typer.Option(False, "--fp32", help="Store float32 instead of float16."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Rebuild a cache started with other settings."),
) -> None:
    """Cache frozen-backbone frame and caption features; train on them with --set data.features_dir=OUT."""
    out_folder(out)
    cfg = _load(config, set_)
    import torch

    from tvr.pipeline import build_feature_cache

    manifest = build_feature_cache(
        cfg,
        out,
        [s.strip() for s in splits.split(",") if s.strip()],
        shard_size,
        torch.float32 if fp32 else torch.float16,
        overwrite=overwrite,
    )
    for name, info in manifest["splits"].items():
        console.print(
            f"{name}: {info['num_videos']} videos, {info['num_texts']} captions, "
            f"{len(info['skipped'])} unreadable video(s) skipped"
        )


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", "-o"),
    num_videos: int = typer.Option(120, help="Videos in total."),
    num_test: int = typer.Option(30, help="Of which test videos."),
    captions: int = typer.Option(5, help="Paraphrased captions per video."),
    seed: int = typer.Option(0),
) -> None:
    """Render a synthetic captioned video set (real mp4 files) in the MSR-VTT annotation format."""
    out_folder(out)
    from tvr.data.synthetic import SynthConfig, generate_synthetic_dataset

    summary = generate_synthetic_dataset(
        out,
        SynthConfig(num_videos=num_videos, num_test=num_test, captions_per_video=captions, seed=seed),
        progress=True,
    )
    console.print(summary)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo_out"), "--out", "-o"),
    quick: bool = typer.Option(False, "--quick", help="A few steps only (smoke test)."),
    method: str = typer.Option(
        "clip4clip", help="Head to train: a registered head (see `tvr heads`) or an import path 'pkg.module:Class'."
    ),
) -> None:
    """Synthesise a dataset, train a small randomly initialised model on CPU, evaluate, print metrics."""
    out_folder(out)
    from tvr.demo import run_demo

    summary = run_demo(out, quick=quick, method=method)
    for tag, metrics in summary.get("test", {}).items():
        _print_metrics(metrics, f"synthetic test split ({tag} checkpoint)")
    console.print(f"run folder: {escape(str(out / 'run'))}", highlight=False)


@app.command()
def heads() -> None:
    """List the method heads (registered in tvr.models.heads or by installed packages) and their options."""
    import dataclasses

    from rich.table import Table

    from tvr.models.heads.registry import available_heads, head_class

    table = Table(title="method heads (head.name; options under head.options)")
    for column in ("name", "indexable (defaults)", "options (default; choices)"):
        table.add_column(column)
    for name in available_heads():
        cls = head_class(name)
        fields = []
        for f in dataclasses.fields(cls.Options):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            choices = f.metadata.get("choices")
            fields.append(f"{f.name}={default!r}" + (f" {list(choices)}" if choices else ""))
        # indexability may depend on the options (CLIP4Clip: mean pooling only); show it for the defaults
        indexable = cls(8, cls.Options()).indexable
        table.add_row(name, "yes" if indexable else "no", "\n".join(fields) or "-")
    Console().print(table)


@app.command()
def presets() -> None:
    """List the presets shipped with tvr; pass a name to --config (e.g. --config gare/msrvtt)."""
    from tvr.config import PRESET_DIR, available_presets

    for name in available_presets():
        print(name)
    console.print(f"[dim]({escape(str(PRESET_DIR))}; a path to your own YAML file works as well)[/dim]")


@app.command("convert-openai")
def convert_openai(
    checkpoint: Path = typer.Argument(..., exists=True, dir_okay=False, help="OpenAI ViT-B-32.pt / ViT-B-16.pt"),
    out: Path = typer.Argument(..., help="Folder for the HF CLIP checkpoint"),
    bpe: Path | None = typer.Option(None, help="bpe_simple_vocab_16e6.txt.gz: also write the tokenizer files"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT folder."),
) -> None:
    """Convert an OpenAI CLIP checkpoint into a HF CLIPModel folder usable as model.clip. The file's tensors are
    read as data: nothing in it runs (docs/security.md)."""
    from tvr.models.convert_openai import convert_openai_checkpoint

    out_folder(out, "OUT")
    convert_openai_checkpoint(checkpoint, out, overwrite=overwrite, bpe=bpe)
    console.print(f"wrote {escape(str(out))}", highlight=False)


@app.command()
def tokenizer(
    bpe: Path = typer.Argument(..., exists=True, dir_okay=False, help="CLIP's bpe_simple_vocab_16e6.txt.gz"),
    out: Path = typer.Argument(...),
) -> None:
    """Build CLIP's 49,408-token tokenizer files (vocab.json + merges.txt) from the BPE merges file, offline."""
    from tvr.data.tokenizer import build_clip_tokenizer_files

    out_folder(out, "OUT")
    build_clip_tokenizer_files(bpe, out)
    console.print(f"wrote {escape(str(out))}", highlight=False)


@app.command("import-checkpoint")
def import_checkpoint(
    src: Path = typer.Argument(..., help="CLIP4Clip pytorch_model.bin or GARE best.pth (a torch.save-d state dict)"),
    config: str = typer.Option(
        ..., "--config", "-c", help="YAML file or shipped preset name of the model the checkpoint is (`tvr presets`)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="tvr checkpoint to write (for tvr eval --checkpoint)"),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override (repeatable)."),
    partial: bool = typer.Option(False, "--partial", help="Load what fits; keep the built model's values elsewhere."),
    report: Path | None = typer.Option(None, "--report", help="Also write the full key report (JSON) here."),
) -> None:
    """Import a CLIP4Clip / GARE release checkpoint into the tvr model of --config and save it as a tvr checkpoint."""
    from tvr.models.import_checkpoint import CheckpointImportError, import_release_checkpoint
    from tvr.train.checkpoint import save_checkpoint
    from tvr.utils.io import atomic_write_json

    out_file(out)
    cfg = _load(config, set_)
    try:
        model, rep = import_release_checkpoint(src, cfg, partial=partial)
    except CheckpointImportError as exc:
        if _DEBUG["on"]:
            raise
        say("import failed", str(exc))
        raise typer.Exit(2) from None
    state = {
        "imported_from": str(src),
        "import_layout": rep.layout,
        "import_counts": {k: len(v) for k, v in rep.to_dict().items() if isinstance(v, list)},
    }
    save_checkpoint(out, model, state=state, config=cfg)
    if report is not None:
        atomic_write_json(report, rep.to_dict())
    colour = "green" if rep.complete else "yellow"
    console.print(
        f"[{colour}]{rep.layout}: {len(rep.mapped)} tensors mapped, {len(rep.missing)} missing, "
        f"{len(rep.unexpected)} unexpected, {len(rep.ignored)} ignored (unused by the released model)[/{colour}]"
    )
    for title, items in (("missing", rep.missing), ("unexpected", rep.unexpected), ("mismatched", rep.mismatched)):
        if items:
            say(f"  {title}", ", ".join(items[:10]) + (f", … ({len(items)})" if len(items) > 10 else ""), "yellow")
    console.print(f"wrote {escape(str(out))}", highlight=False)


@app.command("check-data")
def check_data(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override (repeatable)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the full report (every offending id) here."),
    full: bool = typer.Option(False, "--full", help="Decode every frame (finds truncated files; as slow as a pass)."),
    workers: int = typer.Option(0, "--workers", "-j", help="Probe processes (0 = one per CPU, at most 8)."),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="CLIP tokenizer for caption lengths: bpe_simple_vocab_16e6.txt.gz or a folder."
    ),
) -> None:
    """Check every split, video and caption a run would read; exit 1 when a run would trip, naming each problem."""
    from tvr.data.check import check_data as run_check
    from tvr.data.check import render_report
    from tvr.utils.io import atomic_write_json

    if json_path is not None:
        out_file(json_path, "--json")
    cfg = _load(config, set_)
    report = run_check(cfg, full=full, workers=workers, tokenizer=tokenizer, progress=True)
    if json_path is not None:
        atomic_write_json(json_path, report)
    render_report(report, Console(), json_path=json_path)
    raise typer.Exit(0 if report["ok"] else 1)


prepare_app = _Commands(no_args_is_help=True, help="Turn raw downloads into the training form (resumable).")
app.add_typer(prepare_app, name="prepare")


def _prepare_summary(report: dict, what: str, report_name: str) -> None:
    summary = report["summary"]
    counts = ", ".join(f"{v} {k}" for k, v in summary.items() if k not in ("total", "seconds"))
    console.print(f"{what}: {summary['total']} files ({counts or 'nothing to do'}) in {summary['seconds']} s")
    for status, style in (("failed", "red"), ("ignored", "yellow")):
        entries = [e for e in report["files"] if e["status"] == status]
        for entry in entries[:20]:
            say(f"  {status}", f"{entry['source']}: {entry['error']}", style)
        if len(entries) > 20:
            console.print(f"  … and {len(entries) - 20} more {status}")
    copied = [e for e in report["files"] if e["status"] == "copied"]
    if copied:
        console.print(f"[yellow]{len(copied)} file(s) could not be re-encoded and were copied unchanged[/yellow]")
    console.print(f"report: {escape(str(Path(report['destination']) / report_name))}", highlight=False)
    if any(e["status"] == "failed" for e in report["files"]):
        raise typer.Exit(1)


@prepare_app.command("videos")
def prepare_videos_cmd(
    src: Path = typer.Argument(..., help="Folder of raw videos (searched recursively)."),
    dst: Path = typer.Argument(..., help="Output folder (same layout, every file <name>.mp4); rerun to resume."),
    fps: float = typer.Option(3.0, help="Output frame rate (0 = keep the source's)."),
    size: int = typer.Option(224, "--size", help="Shorter side in pixels, even (0 = keep)."),
    codec: str = typer.Option("libx264", help="PyAV encoder."),
    crf: int = typer.Option(23, help="x264 constant rate factor (lower = better, larger)."),
    preset: str = typer.Option("medium", help="x264 preset."),
    workers: int = typer.Option(0, "--workers", "-j", help="Worker processes (0 = one per CPU, at most 8)."),
    copy_on_failure: bool = typer.Option(
        False, "--copy-on-failure", help="Copy a file that cannot be re-encoded unchanged (reference behaviour)."
    ),
    flat: bool = typer.Option(False, "--flat", help="Write every output directly into DST (no sub-folders)."),
) -> None:
    """Re-encode every video under SRC to the training form (3 fps, shorter side 224, H.264, no audio)."""
    from tvr.data.prepare import EncodeSettings, prepare_videos

    out_folder(dst, "DST")
    report = prepare_videos(src, dst, EncodeSettings(fps=fps, short_side=size, codec=codec, crf=crf, preset=preset),
                            workers=workers, copy_on_failure=copy_on_failure, progress=True, flat=flat)
    _prepare_summary(report, "prepare videos", "prepare_report.json")


@prepare_app.command("frames")
def prepare_frames_cmd(
    src: Path = typer.Argument(..., help="Folder of (prepared) videos."),
    dst: Path = typer.Argument(..., help="Frame cache folder (<name>.npy per video); rerun to resume."),
    config: str | None = typer.Option(None, "--config", "-c",
                                      help="YAML file or preset name: take max_frames / frame_rate / image_size / "
                                      "sampling from data.*"),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override of --config, e.g. --set data.max_frames=8."),
    max_frames: int = typer.Option(12, help="Frames per clip (data.max_frames)."),
    frame_rate: float = typer.Option(1.0, help="Candidate frames per second (data.frame_rate)."),
    image_size: int = typer.Option(224, help="Crop size the frames are resized for (data.image_size)."),
    sampling: str = typer.Option("clip4clip", help="clip4clip | clipvip (evaluation-mode indices)."),
    workers: int = typer.Option(0, "--workers", "-j", help="Worker processes (0 = one per CPU, at most 8)."),
    flat: bool = typer.Option(False, "--flat", help="Write every .npy directly into DST (no sub-folders)."),
) -> None:
    """Decode once the frames every clip reads and store them as uint8 .npy files (a frame cache)."""
    from tvr.data.prepare import FrameSettings, extract_frames

    out_folder(dst, "DST")
    if set_ and config is None:
        raise UserError("--set changes a config: pass --config as well (or the frame options themselves)")
    if config is not None:
        data = _load(config, set_).data
        max_frames, frame_rate, image_size, sampling = data.max_frames, data.frame_rate, data.image_size, data.sampling
    report = extract_frames(src, dst, FrameSettings(max_frames, frame_rate, image_size, sampling),
                            workers=workers, progress=True, flat=flat)
    _prepare_summary(report, "prepare frames", "frames_report.json")


def run() -> None:  # pragma: no cover - console entry point helper
    sys.exit(app())


if __name__ == "__main__":  # `python -m tvr.cli ...`, e.g. under torchrun
    run()
