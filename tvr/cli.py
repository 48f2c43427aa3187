"""``tvr`` command line: index / search / serve videos, train, eval, analyze, plot, features, synth, demo, bench, and
checkpoint/tokenizer conversion."""

from __future__ import annotations

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

import tvr.search.defaults as search_defaults
from tvr.search.defaults import DUAL_ENCODER_PRESETS
from tvr.utils.errors import Interrupted, RestartableStopError, UserError

#: messages (progress, notes, warnings, errors); results (tables, JSON) go to stdout (:func:`stdout_console`)
console = Console(stderr=True)
#: the width of a console writing into a pipe or a file: wide enough that no line or table row is folded
UNFOLDED_WIDTH = 100_000
#: ``--debug`` (or TVR_DEBUG=1): let user errors show their traceback as well
_DEBUG = {"on": os.environ.get("TVR_DEBUG", "") not in ("", "0")}
#: the global ``tvr --verbose``: commands that are quiet by default (search, serve) talk as well
_VERBOSE = {"on": False}
#: OS errors about a path the user gave (a missing folder, a file where a folder belongs, no permission)
_PATH_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
CONFIG_HELP = "YAML file or shipped preset name, e.g. gare/msrvtt (`tvr presets` lists them)."


#: how a command continues after a full disk stopped it, where rerunning it does more than start over
_CONTINUES = {
    "tvr train": "with --resume auto: the run continues from its last checkpoint (or starts, if it wrote none)",
    "tvr features": "it continues the cache where it stopped",
    "tvr prepare videos": "it continues where it stopped",
    "tvr prepare frames": "it continues where it stopped",
    "tvr index": "it continues the index where it stopped",
    "tvr bench": "it resumes the bench",
}
#: what a command interrupted by Ctrl-C leaves, when it says nothing more specific
INTERRUPTED = (
    "interrupted: everything finished so far is kept (every file is written whole or not at all); "
    "rerun the same command to continue"
)
#: what Ctrl-C on ``tvr serve`` says: a server has nothing to continue
SERVE_STOPPED = (
    "the server shut down on Ctrl-C; serving changes nothing in the index, so the same command serves it again"
)


def fit_to_stream(out: Console) -> Console:
    """Fold lines at the terminal's width only where ``out`` writes to a terminal: into a pipe or a file (``| grep``,
    ``> results.txt``) every line and table row goes whole, where rich would fold them at 80 columns."""
    whole = not out.is_terminal
    out.soft_wrap = whole
    out.width = UNFOLDED_WIDTH if whole else None  # None: the terminal's own width, asked at each print
    return out


def stdout_console() -> Console:
    """A console for a command's results on stdout (a table with its title, lines a pipe reads)."""
    return fit_to_stream(Console())


def say(label: str, text: str, style: str = "red") -> None:
    """Print ``label: text`` on stderr as one logical line. ``text`` is the user's or an exception's text, never
    console markup: it is escaped, so ``[...]`` (ranges, key lists, paths) prints as written."""
    # soft_wrap: one logical line (the terminal may still fold it), so paths stay copyable
    console.print(f"[{style}]{label}:[/{style}] {escape(text)}", highlight=False, soft_wrap=True)


def _is_user_error(exc: BaseException) -> bool:
    from tvr.utils.io import is_disk_full

    return isinstance(exc, (UserError, *_PATH_ERRORS)) or is_disk_full(exc)


def _file_system(path: str | os.PathLike) -> str:
    """The mount point holding ``path`` and the space free on it, for a disk-full message."""
    import shutil

    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = where
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = shutil.disk_usage(mount).free
    except OSError:
        return f"the file system mounted at {mount}"
    left = f"{free / 2**20:,.0f} MiB" if free >= 2**20 else f"{free / 2**10:,.0f} KiB"
    return f"the file system mounted at {mount}, {left} free"


def disk_full_message(exc: OSError, command: str) -> str:
    """The one message of a full disk: the file that could not be written, the file system it is on and the space
    left there, that nothing written was lost, and how ``command`` continues."""
    where = f" writing {exc.filename} ({_file_system(exc.filename)})" if exc.filename else f" ({_file_system('.')})"
    again = _CONTINUES.get(command)
    return (
        f"no space left on the device{where} ({exc.strerror or exc}); nothing already written was lost (every file "
        f"is written whole or not at all, a half-written one is removed): free some space there and run {command} "
        "again" + (f" {again}" if again and again.startswith("with") else f": {again}" if again else "")
    )


def _describe(exc: BaseException, command: str) -> str:
    from tvr.utils.io import is_disk_full

    if is_disk_full(exc):
        return disk_full_message(exc, command)
    if isinstance(exc, OSError) and not isinstance(exc, UserError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def friendly_errors(fn: Callable[..., Any], command: str = "the command") -> Callable[..., Any]:
    """Run a command; a user error prints one or two lines and exits with code 2 (bugs keep their traceback);
    Ctrl-C says what was kept and exits with code 130; a job stopped to be restarted (a preempted training run)
    says where it stopped and exits with its code (143). ``command``: how the user runs it (``tvr prepare
    videos``), for a message that says how to continue."""

    @functools.wraps(fn)
    def run_command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RestartableStopError as exc:
            say("stopped", str(exc), "yellow")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            if _DEBUG["on"]:
                raise
            said = str(exc) if isinstance(exc, Interrupted) else INTERRUPTED.removeprefix("interrupted: ")
            say("interrupted", said, "yellow")
            raise typer.Exit(130) from None
        except Exception as exc:
            if _DEBUG["on"] or not _is_user_error(exc):
                raise
            say("error", _describe(exc, command))
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
    """Every command registered on the app reports user errors without a traceback; ``prefix``: how the user
    reaches its commands (``tvr prepare``)."""

    def __init__(self, *args: Any, prefix: str = "tvr", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = prefix

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, **kwargs)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = args[0] if args else kwargs.get("name") or fn.__name__.lower().replace("_", "-")
            return register(friendly_errors(fn, f"{self.prefix} {name}"))

        return wrap


app = _Commands(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "Text-video retrieval: search your videos by text (index, search, serve), train and evaluate the methods "
        "(CLIP4Clip, GARE, TV-ProxyNet, GraviAlign), analyse and plot runs, synthesise data. First steps: README.md; "
        "tvr demo trains a small model end to end on CPU."
    ),
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
    from tvr.eval.report import metrics_notes, metrics_table

    # the title on stdout with its table (the notes below it too): `tvr eval ... > metrics.txt` keeps them together
    stdout_console().print(f"\n[bold]{escape(title)}[/bold]")
    rows = {k: v for k, v in metrics.items() if k != "info"}
    print(metrics_table(rows))
    for line in metrics_notes(rows, metrics.get("info", {})):
        print(line)
    skipped = metrics.get("info", {}).get("skipped_videos") or []
    if skipped:
        say(
            f"{len(skipped)} unreadable video(s) left out",
            ", ".join(str(s["id"]) for s in skipped[:10])
            + (f", … ({len(skipped)} in all)" if len(skipped) > 10 else ""),
            "yellow",
        )


def _print_version(asked: bool) -> None:
    if asked:
        from tvr import __version__

        print(f"tvr {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print tvr's version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of user errors (bad config, files, …)."),
    trust: bool = typer.Option(
        False,
        "--trust-code",
        help="Let configs, checkpoints and indexes name a head by import path (pkg.module:Class), which imports and "
        "runs that module (also TVR_TRUST_CODE=1). Registered heads need no trust.",
    ),
) -> None:
    from tvr.config import code_trusted, trust_code

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # per invocation as well: a quiet command (search, serve) lowers it for its own run only
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    # decided per invocation (an app invoked twice in one process must not keep the first one's --debug)
    _DEBUG["on"] = debug or os.environ.get("TVR_DEBUG", "") not in ("", "0")
    _VERBOSE["on"] = verbose
    fit_to_stream(console)  # per invocation: stderr may be a terminal in one and a log file in the next
    before = code_trusted()
    trust_code(trust or os.environ.get("TVR_TRUST_CODE", "") not in ("", "0"))
    ctx.call_on_close(lambda: trust_code(before))  # for this command only (an app invoked again in one process)


@app.command()
def train(
    config: str | None = typer.Option(
        None,
        "--config",
        "-c",
        help=CONFIG_HELP + " With --resume: default, the run folder's config.yaml (the run as it was recorded).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder (config, logs, checkpoints, metrics)."),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override, e.g. --set train.lr=3e-4 (repeatable)."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue from OUT/last.pt exactly where it stopped. --resume auto: continue when OUT holds last.pt, "
        "else start a new run (one command line for the first launch and every restart or requeue).",
    ),
    resume_mode: str | None = typer.Argument(None, metavar="[auto]", help="After --resume: auto.", show_default=False),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over in a run folder that holds checkpoints."),
    no_test: bool = typer.Option(False, "--no-test", help="Skip the final test-split evaluation."),
) -> None:
    """Train a method; select on validation; evaluate the test split once at the end.

    SIGTERM or SIGUSR1: finish the step, write last.pt, exit 143 (train.preemption_signals; docs/scaling.md)."""
    if resume_mode is not None and (not resume or resume_mode != "auto"):
        raise UserError(f"unexpected argument {resume_mode!r}: the only word tvr train takes is 'auto', after --resume")
    out_folder(out)
    cfg = _load(config or _recorded_run_config(out, resume_mode or resume), set_)
    from tvr.pipeline import run_train

    try:
        summary = run_train(cfg, out, resume=resume_mode or resume, final_test=not no_test, overwrite=overwrite)
    except KeyboardInterrupt:
        if _DEBUG["on"]:
            raise
        say("interrupted", _train_interrupted(out), "yellow")
        raise typer.Exit(130) from None
    for tag, metrics in summary.get("test", {}).items():
        _print_metrics(metrics, f"test ({tag} checkpoint)")
    console.print(f"run folder: {escape(str(out))}", highlight=False)


def _recorded_run_config(out: Path, resume: bool | str) -> Path:
    """The config a ``tvr train --resume`` without ``--config`` runs: the one the run folder records."""
    from tvr.pipeline.run_folder import CONFIG

    if not resume:
        raise UserError(
            "tvr train needs --config (a YAML file or a preset name: tvr presets lists them); only --resume takes "
            f"the run folder's {CONFIG} instead"
        )
    recorded = out / CONFIG
    if not recorded.is_file():
        raise UserError(
            f"--resume without --config: {out} holds no {CONFIG} (no run was started there), so there is no "
            "recorded config to continue with: pass --config to start one"
        )
    return recorded


def _train_interrupted(out: Path) -> str:
    """What an interrupted ``tvr train`` left, and how to continue it."""
    last = out / "last.pt"
    try:
        from tvr.utils.torch_files import load_torch_file

        state = load_torch_file(last, mmap=True)["state"]
        where = f"step {state['global_step']}, epoch {state['epoch'] + 1} batch {state['batch_in_epoch']}"
    except FileNotFoundError:
        return (
            f"stopped before the first checkpoint: {out} holds no last.pt, so there is nothing to resume; rerun "
            "the command to start again"
        )
    except Exception:  # noqa: BLE001 - only for the message
        where = "its position unreadable"
    return (
        f"{last} ({where}) is kept, with the logs up to it; the same command with --resume continues from it "
        "exactly where it stopped (--resume auto too)"
    )


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
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the figures (PNG + JSON each, analysis.json)."),
    config: str | None = typer.Option(
        None, "--config", "-c", help="Default: the config the checkpoint carries. " + CONFIG_HELP
    ),
    split: str = typer.Option("val", "--split", help="Split to analyse: val (default) | test | test_multi | train."),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override, e.g. --set train.device=cpu (repeatable)."),
) -> None:
    """The papers' analyses of a checkpoint's head on one split (docs/analysis.md): score distributions and ranks for
    every head; gradient tension and Δ geometry (GARE), the γ sweep and proxy space (TV-ProxyNet), uncertainty
    (GraviAlign). The checkpoint carries its config: --config / --set only change it, as for tvr eval."""
    out_folder(out)
    cfg = _load(config, set_) if config else _load_from_checkpoint(checkpoint, set_)
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
    for note in manifest["notes"]:
        say("note", note, "yellow")


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
    content: str = typer.Option("shapes", help="shapes | objects (photos shipped with scikit-image / opencv-doc)."),
    size: int = typer.Option(64, help="Frame width = height in pixels (even)."),
    seconds: float = typer.Option(3.0, help="Clip length in seconds."),
    fps: float = typer.Option(8.0, help="Frames per second."),
    pair_prob: float = typer.Option(0.5, help="Temporal order: share of groups that are twins differing in time only."),
    shared_attributes: float = typer.Option(
        0.0, help="False negatives: chance a group repeats an earlier video's caption attributes."
    ),
    paraphrase: float = typer.Option(1.0, help="Paraphrase diversity in [0, 1] (1 = every wording)."),
    distractor_prob: float = typer.Option(0.3, help="Chance a single-object video shows a distractor."),
    distractor_motion: float = typer.Option(0.0, help="Chance a distractor drifts instead of standing still."),
    vague_captions: float = typer.Option(
        0.0, help="Ambiguity: chance a caption other than the full one names none of its objects."
    ),
    lossless: bool = typer.Option(
        False, "--lossless", help="Lossless RGB H.264: clips decode to the rendered frames, byte-identical re-renders."
    ),
    val_like_test: bool = typer.Option(
        False, "--val-like-test", help="Whole twin / false-negative groups per split; MSRVTT_val.csv like the test."
    ),
    val_fraction: float = typer.Option(0.1, help="Share of the non-test videos in the validate split."),
) -> None:
    """Render a synthetic captioned video set (real mp4 files) in the MSR-VTT annotation format; the dials are
    recorded in OUT/synth_meta.json."""
    out_folder(out)
    from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset

    summary = generate_synthetic_dataset(
        out,
        SynthConfig(
            num_videos=num_videos,
            num_test=num_test,
            captions_per_video=captions,
            seed=seed,
            content=content,
            size=size,
            seconds=seconds,
            fps=fps,
            pair_prob=pair_prob,
            shared_attributes=shared_attributes,
            paraphrase=paraphrase,
            distractor_prob=distractor_prob,
            distractor_motion=distractor_motion,
            vague_captions=vague_captions,
            lossless=lossless,
            val_like_test=val_like_test,
            val_fraction=val_fraction,
        ),
        progress=True,
    )
    console.print(
        # train + validate: MSR-VTT's 9k training list holds both (a run holds its own validation out of it)
        f"wrote {summary['num_videos']} videos ({summary['num_train'] + summary['num_validate']} train, "
        f"{summary['num_test']} test; {summary['num_frames']} frames each, {summary['codec']}) and "
        f"{summary['num_sentences']} captions in the MSR-VTT format to {out}; its settings: {out / 'synth_meta.json'}"
        f"\ntrain on it: tvr train --config cpu/clip4clip --set data.annotations={out} "
        f"--set data.video_dir={out / 'videos'} --out runs/first (tvr presets: cpu/*)",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )


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
    from tvr.bench.demo import run_demo

    summary = run_demo(out, quick=quick, method=method)
    for tag, metrics in summary.get("test", {}).items():
        _print_metrics(metrics, f"synthetic test split ({tag} checkpoint)")
    console.print(f"run folder: {escape(str(out / 'run'))}", highlight=False)


bench_app = _Commands(
    prefix="tvr bench", help="Methods × seeds: does a method beat the baseline? (tvr bench --config NAME --out DIR)"
)


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    config: str = typer.Option(
        None, "--config", "-c", help="Bench YAML file or shipped bench config name (default, quick; tvr/configs/bench)."
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Bench folder; rerun the same command to resume."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Runs at a time, each in its own process (CPU cores to use)."),
    rerun_changed: bool = typer.Option(
        False, "--rerun-changed", help="Run again the finished runs (and data) made with another config."
    ),
    allow_unlike_validation: bool = typer.Option(
        False, "--allow-unlike-validation", help="Go on when validation is not built like the test."
    ),
    sweep: str = typer.Option(
        None, "--sweep", help="DIAL=v1,v2,...: one bench per value of a synthetic dial, and the gain-vs-dial curve."
    ),
) -> None:
    """Methods × seeds on cached features: validation picks checkpoints and inference settings, the test split is
    evaluated once per run; writes OUT/results.json, OUT/results.md (mean ± 95 % CI, paired differences from the
    baseline with Holm-adjusted p-values and minimum detectable differences) and plots. Resumable: finished runs
    made with the same config are kept. `tvr bench report` writes a document from committed results."""
    if ctx.invoked_subcommand is not None:
        return
    friendly_errors(_bench, "tvr bench")(config, out, jobs, rerun_changed, allow_unlike_validation, sweep)


def _bench(
    config: str | None, out: Path | None, jobs: int, rerun_changed: bool, allow_unlike_validation: bool, sweep: str
) -> None:
    if not config or out is None:
        raise UserError("tvr bench needs --config (a bench YAML or a shipped name) and --out (the bench folder)")
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: expected a positive number of runs at a time")
    from tvr.bench.runs import load_bench_config, run_bench

    out_folder(out)
    spec = load_bench_config(config)
    options = {"jobs": jobs, "rerun_changed": rerun_changed, "allow_unlike_validation": allow_unlike_validation}
    echo = lambda line: console.print(line, highlight=False)  # noqa: E731
    command = f"tvr bench --config {config} --out {out}" + (f" --sweep {sweep}" if sweep else "")
    command += f" --jobs {jobs}" if jobs > 1 else ""
    if sweep:
        from tvr.bench.sweep import parse_sweep, run_sweep

        plan = parse_sweep(sweep, spec)  # an unknown dial or a bad value stops here, before any work
        swept = run_sweep(spec, plan, out, command=command, echo=echo, **options)
        from tvr.bench.report import sweep_lines

        print("\n".join(sweep_lines(swept)))
        console.print(f"report: {out / 'sweep.md'}")
        return
    results = run_bench(spec, out, command=command, echo=echo, **options)
    from tvr.bench.report import differences_table, results_table

    print(results_table(results))
    print()
    print(differences_table(results))
    console.print(f"report: {out / 'results.md'}")


@bench_app.command("report")
def bench_report(
    results: Path = typer.Option(
        ..., "--results", exists=True, dir_okay=False, help="A bench's results.json (the document's `default`)."
    ),
    template: Path = typer.Option(
        ..., "--template", exists=True, dir_okay=False, help="Markdown with {{...}} placeholders (docs/bench.md)."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The markdown file to write (figures go beside it)."),
    sweeps: list[Path] = typer.Option(
        None, "--sweep", exists=True, dir_okay=False, help="A sweep.json, named by its dial (repeatable)."
    ),
    figures: str = typer.Option(
        "figures/results", help="Folder for the figures, relative to --out's folder (written there, linked so)."
    ),
    sources: list[str] = typer.Option(
        None, "--source", help="NAME=FILE: another JSON record the template reads as {{NAME...}} (repeatable)."
    ),
) -> None:
    """Write a results document from committed bench results: every table and every number in it is computed from
    the JSON files, so `tests/test_bench_report.py` can recompute the shipped docs/results.md."""
    out_file(out)
    from tvr.bench.results_document import write_report

    extra: dict[str, Path] = {}
    for item in sources or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            raise UserError(f"--source {item!r}: expected NAME=FILE with an existing JSON file")
        extra[name] = Path(path)
    write_report(results, template, out, sweeps or [], figures, extra)
    console.print(f"wrote {out}")


app.add_typer(bench_app, name="bench")


def _settings_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted name, default, allowed values, description) of each field of the settings dataclass ``cls``, a
    section's fields one level down (``tiny.embed_dim``)."""
    import dataclasses

    from tvr.config import field_default, field_rule_text
    from tvr.utils.fielddoc import field_comments

    rows = []
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        default = field_default(f)
        if dataclasses.is_dataclass(default) and not prefix:
            rows.append((f"{f.name}", "", "", comments.get(f.name, "")))
            rows += _settings_rows(type(default), f"{f.name}.")
            continue
        rows.append((f"{prefix}{f.name}", repr(default), field_rule_text(f), comments.get(f.name, "")))
    return rows


def _print_settings(title: str, cls: type | None, column: str, empty: str) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for heading in (column, "default", "allowed", "description"):
        table.add_column(heading)
    rows = _settings_rows(cls) if cls is not None else []
    for row in rows:
        # Text cells: descriptions hold brackets ("[logvar_min, logvar_max]") that are not markup
        table.add_row(*map(Text, row))
    if not rows:
        table.add_row("-", "", "", empty)
    stdout_console().print(table)


@app.command()
def heads() -> None:
    """List the method heads (registered in tvr.methods or by installed packages), their options (set under
    head.options) with defaults, allowed values and what each does."""
    from tvr.models.heads.registry import available_heads, head_class

    for name in available_heads():
        cls = head_class(name)
        # indexability may depend on the options (CLIP4Clip: mean pooling only); show it for the defaults
        indexable = cls(8, cls.Options()).indexable
        title = f"head.name: {name} (indexable with its defaults: {'yes' if indexable else 'no'})"
        _print_settings(title, cls.Options, "option", "(no options)")


@app.command()
def backbones() -> None:
    """List the backbones (registered in tvr/models/backbones or by installed packages) and the settings each reads
    (set as model.<setting>), with defaults, allowed values and what each does."""
    from tvr.models.backbones.registry import available_backbones, backbone_spec

    for name in available_backbones():
        settings = type(backbone_spec(name)).Settings
        _print_settings(f"model.backbone: {name}", settings, "model.<setting>", "(no settings)")


@app.command()
def datasets() -> None:
    """List the dataset formats (registered in tvr/data/formats or by installed packages; docs/datasets.md) and the
    settings only each reads (set as data.<setting>), with defaults, allowed values and what each does."""
    from tvr.data.formats.registry import available_dataset_formats, dataset_format

    for name in available_dataset_formats():
        fmt = dataset_format(name)
        splits = ", ".join(("train", "val", "test", *fmt.extra_splits))
        title = f"data.dataset: {name} (splits: {splits})"
        _print_settings(title, fmt.Settings, "data.<setting>", "(no settings of its own)")


@app.command()
def presets() -> None:
    """List the presets shipped with tvr, each with what it is, the paper table or ablation it reproduces and the
    hardware it expects; pass a name to --config (e.g. --config gare/msrvtt)."""
    from tvr.config import PRESET_DIR, available_presets, preset_description

    names = available_presets()
    width = max(map(len, names))
    for name in names:
        # one line a preset, so the list stays greppable (tvr presets | grep cpu/)
        print(f"{name:<{width}}  {preset_description(name)}")
    where = "tvr/methods/<method>/presets, tvr/models/backbones/<backbone>/presets"
    console.print(f"[dim]({escape(str(PRESET_DIR))} and {where}; a path to your own YAML file works as well)[/dim]")
    benches = sorted(p.stem for p in (PRESET_DIR / "bench").glob("*.yaml"))
    console.print(f"[dim]bench configs for tvr bench --config: {', '.join(benches)}[/dim]")


@app.command("convert-openai")
def convert_openai(
    checkpoint: Path = typer.Argument(..., exists=True, dir_okay=False, help="OpenAI ViT-B-32.pt / ViT-B-16.pt"),
    out: Path = typer.Argument(..., help="Folder for the HF CLIP checkpoint"),
    bpe: Path | None = typer.Option(None, help="bpe_simple_vocab_16e6.txt.gz: also write the tokenizer files"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT folder."),
) -> None:
    """Convert an OpenAI CLIP checkpoint into a HF CLIPModel folder usable as model.clip. The file's tensors are
    read as data: nothing in it runs (docs/security.md)."""
    from tvr.models.backbones.clip.convert_openai import convert_openai_checkpoint

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
    from tvr.models.import_checkpoint import CheckpointImportError
    from tvr.pipeline.release import import_checkpoint as run_import

    out_file(out)
    cfg = _load(config, set_)
    try:
        rep = run_import(src, cfg, out, partial=partial, report_path=report)
    except CheckpointImportError as exc:
        if _DEBUG["on"]:
            raise
        say("import failed", str(exc))
        raise typer.Exit(2) from None
    colour = "green" if rep.complete else "yellow"
    console.print(
        f"[{colour}]{rep.layout}: {len(rep.mapped)} tensors mapped, {len(rep.missing)} missing, "
        f"{len(rep.unexpected)} unexpected, {len(rep.ignored)} ignored (unused by the released model)[/{colour}]"
    )
    for title, items in (("missing", rep.missing), ("unexpected", rep.unexpected), ("mismatched", rep.mismatched)):
        if items:
            say(f"  {title}", ", ".join(items[:10]) + (f", … ({len(items)})" if len(items) > 10 else ""), "yellow")
    console.print(f"wrote {escape(str(out))}", highlight=False)


#: up to this many unusable videos the printed check-data table names every one
CHECK_LIST_ALL = 20


def render_check_report(report: dict[str, Any], console: Console, json_path: str | os.PathLike | None = None) -> None:
    """Print a ``tvr check-data`` report as rich tables: splits, unusable videos by reason (with examples), video
    statistics, and the error / warning lines. ``json_path``: where the full JSON report was written (None: it was
    not, and the text says how to get it). Every text from the data is escaped: ``[...]`` prints as written, never as
    markup."""
    console.print(_check_splits_table(report))
    _print_unusable_videos(report["videos"], console, json_path)
    _print_video_statistics(report.get("video_stats") or {}, console)
    for line in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)
    for line in report["errors"]:
        console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
    details = (
        f"details in the JSON report {json_path}"
        if json_path is not None
        else "for every detail, rerun with --json FILE"
    )
    console.print(
        "[green]OK: a run would not trip over this data[/green]"
        if report["ok"]
        else f"[red]NOT OK: fix the errors above ({escape(details)})[/red]",
        soft_wrap=True,
    )


def _check_splits_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"{escape(report['dataset'])}: splits", title_justify="left")
    for col in (
        "split",
        "status",
        "protocol",
        "texts",
        "videos",
        "usable videos",
        "truncated captions",
        "tokens (median / max)",
    ):
        table.add_column(col, justify="left" if col in ("split", "status", "protocol") else "right")
    for name, entry in report["splits"].items():
        if entry["status"] != "ok":
            table.add_row(name, "[red]error[/red]", "", "", "", "", "", "")
            continue
        tokens = entry.get("caption_tokens")
        table.add_row(
            name,
            "ok",
            escape(entry["protocol"]),
            str(entry["num_texts"]),
            str(entry["num_videos"]),
            str(entry.get("usable_videos", "")),
            str(entry.get("truncated_captions", "–")),
            f"{tokens['median']:g} / {tokens['max']:g}" if tokens else "–",
        )
    return table


def _print_unusable_videos(videos: dict[str, Any], console: Console, json_path: str | os.PathLike | None) -> None:
    from collections import defaultdict

    from rich.table import Table

    from tvr.data.check import EXAMPLES, excerpt

    if not videos["problems"]:
        console.print(f"all {videos['referenced']} referenced videos are usable")
        return
    full = (
        f"every one is in the JSON report {json_path}"
        if json_path is not None
        else "pass --json FILE for the full report, every one listed"
    )
    bad = Table(title=f"unusable videos: {len(videos['problems'])} of {videos['referenced']}", title_justify="left")
    bad.add_column("reason")
    bad.add_column("count", justify="right")
    bad.add_column("examples (id: detail)")
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in videos["problems"]:
        grouped[p["reason"]].append(p)
    shown = len(videos["problems"]) if len(videos["problems"]) <= CHECK_LIST_ALL else EXAMPLES
    for reason, items in grouped.items():
        examples = "\n".join(escape(f"{p['id']}: {excerpt(p['detail'], 160)}") for p in items[:shown])
        if len(items) > shown:
            examples += f"\n… and {len(items) - shown} more ({escape(full)})"
        bad.add_row(reason, str(len(items)), examples)
    console.print(bad)


def _print_video_statistics(stats: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    rows = [(k, v) for k, v in stats.items() if isinstance(v, dict)]
    if not rows:
        return
    table = Table(title="usable videos", title_justify="left")
    for col in ("", "min", "p5", "median", "mean", "p95", "max"):
        table.add_column(col, justify="left" if not col else "right")
    for key, s in rows:
        table.add_row(key, *(f"{s[c]:.4g}" for c in ("min", "p5", "median", "mean", "p95", "max")))
    console.print(table)
    if "padded_videos" in stats:
        console.print(
            f"{stats['padded_videos']} usable video(s) give fewer sampled frames than data.max_frames "
            "(zero-padded, masked)"
        )


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
    from tvr.models.run_spec import resolve_run
    from tvr.utils.io import atomic_write_json

    if json_path is not None:
        out_file(json_path, "--json")
    cfg = _load(config, set_)
    report = run_check(cfg, resolve_run(cfg).tokenizer, full=full, workers=workers, tokenizer=tokenizer, progress=True)
    if json_path is not None:
        atomic_write_json(json_path, report)
    render_check_report(report, stdout_console(), json_path=json_path)
    raise typer.Exit(0 if report["ok"] else 1)


prepare_app = _Commands(
    prefix="tvr prepare", no_args_is_help=True, help="Turn raw downloads into the training form (resumable)."
)
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
    report = prepare_videos(
        src,
        dst,
        EncodeSettings(fps=fps, short_side=size, codec=codec, crf=crf, preset=preset),
        workers=workers,
        copy_on_failure=copy_on_failure,
        progress=True,
        flat=flat,
    )
    _prepare_summary(report, "prepare videos", "prepare_report.json")


@prepare_app.command("frames")
def prepare_frames_cmd(
    src: Path = typer.Argument(..., help="Folder of (prepared) videos."),
    dst: Path = typer.Argument(..., help="Frame cache folder (<name>.npy per video); rerun to resume."),
    config: str | None = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML file or preset name: take max_frames / frame_rate / image_size / sampling from data.*",
    ),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override of --config, e.g. --set data.max_frames=8."),
    max_frames: int = typer.Option(12, help="Frames per clip (data.max_frames)."),
    frame_rate: float = typer.Option(1.0, help="Candidate frames per second (data.frame_rate)."),
    image_size: int = typer.Option(224, help="Crop size the frames are resized for (data.image_size)."),
    sampling: str = typer.Option("clip4clip", help="clip4clip | clipvip (evaluation-mode indices)."),
    workers: int = typer.Option(0, "--workers", "-j", help="Worker processes (0 = one per CPU, at most 8)."),
    flat: bool = typer.Option(False, "--flat", help="Write every .npy directly into DST (no sub-folders)."),
) -> None:
    """Decode once the frames every clip reads and store them as uint8 .npy files (a frame cache)."""
    from tvr.data.frame_cache import FrameSettings
    from tvr.data.prepare import extract_frames

    out_folder(dst, "DST")
    if set_ and config is None:
        raise UserError("--set changes a config: pass --config as well (or the frame options themselves)")
    if config is not None:
        data = _load(config, set_).data
        max_frames, frame_rate, image_size, sampling = data.max_frames, data.frame_rate, data.image_size, data.sampling
    report = extract_frames(
        src, dst, FrameSettings(max_frames, frame_rate, image_size, sampling), workers=workers, progress=True, flat=flat
    )
    _prepare_summary(report, "prepare frames", "frames_report.json")


# --------------------------------------------------------------------------------------------- search


@app.command("index")
def index_cmd(
    videos: Path = typer.Argument(..., help="Folder of videos (searched recursively) or a list file (a path a line)."),
    out: str = typer.Option(
        ...,
        "--out",
        "-o",
        help="Index folder, or a Qdrant collection: qdrant://HOST:PORT/COLLECTION (with --state), qdrant+local:PATH, "
        "qdrant+edge:PATH; run again to resume or to update it.",
    ),
    state: Path | None = typer.Option(
        None,
        "--state",
        file_okay=False,
        help="With --out qdrant://...: the folder of the index's shards (rerank state), on storage query nodes see.",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="A pretrained CLIP or SigLIP used zero-shot: a preset ("
        + ", ".join(DUAL_ENCODER_PRESETS)
        + "), a Hugging Face hub id, a folder saved with save_pretrained, an OpenAI CLIP .pt, or a tvr checkpoint "
        "(default: the offline default encoder).",
    ),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="A tvr checkpoint (as --model CKPT)."),
    config: str | None = typer.Option(
        None,
        "--config",
        "-c",
        help="Index with the model a config builds (no checkpoint): " + CONFIG_HELP,
    ),
    set_: list[str] = typer.Option(None, "--set", help="Dotted override of --config (repeatable; needs --config)."),
    window: float = typer.Option(search_defaults.DEFAULT_WINDOW, "--window", help="Window length in seconds."),
    stride: float = typer.Option(search_defaults.DEFAULT_STRIDE, "--stride", help="Seconds between window starts."),
    workers: int = typer.Option(0, "--workers", "-j", help="Decoding processes (0 = one per CPU, at most 8)."),
    ann_kind: str = typer.Option(
        search_defaults.DEFAULT_ANN, "--ann", help=" | ".join(search_defaults.ANN_KINDS) + ": the shortlist index."
    ),
    ann_threshold: int = typer.Option(
        search_defaults.AUTO_THRESHOLD,
        "--ann-threshold",
        help="Windows above which auto builds HNSW (below: exact flat).",
    ),
    nlist: int = typer.Option(0, "--nlist", help="IVF cells (0 = about 4·√windows)."),
    state_dtype: str = typer.Option(
        search_defaults.DEFAULT_STATE_DTYPE,
        "--state-dtype",
        help=" | ".join(search_defaults.STATE_DTYPES) + ": the stored rerank state.",
    ),
    shard_windows: int = typer.Option(
        search_defaults.SHARD_WINDOWS, "--shard-windows", help="Windows per shard (the unit a kill loses)."
    ),
    device: str = typer.Option("auto", "--device", help="auto (the GPU when there is one) | cpu | cuda | cuda:N."),
) -> None:
    """Index a folder of videos: timestamped windows, embedded by the model, shortlisted by FAISS, reranked exactly."""
    quiet_libraries()
    hide_weight_loading_bars()
    from tvr.pipeline.search import run_index
    from tvr.search.build import IndexOptions, NoVideosError

    options = IndexOptions(
        window=window,
        stride=stride,
        workers=workers,
        ann_kind=ann_kind,
        ann_threshold=ann_threshold,
        nlist=nlist,
        state_dtype=state_dtype,
        shard_windows=shard_windows,
    )
    try:
        report = run_index(
            videos,
            out,
            options,
            checkpoint=checkpoint,
            config=config,
            overrides=set_ or [],
            device=device,
            model=model,
            state=state,
        )
    except NoVideosError as exc:
        say("warning", str(exc), "yellow")
        raise typer.Exit(1) from None
    if not report:  # not rank 0
        return
    console.print(
        f"{out}: {report['indexed']} videos, {report['rows']} windows ({report['embedded']} embedded, "
        f"{report['reused']} unchanged, {len(report['dropped'])} dropped) in {report['seconds']} s"
        + (f", {report['ann']['kind']} shortlist" if report["ann"] else "")
        + (" in Qdrant" if (report["ann"] or {}).get("engine") == "qdrant" else "")
    )
    for bad in report["bad"][:20]:
        console.print(f"  [yellow]skipped[/yellow] {bad['video']}: {bad['error']}", highlight=False)
    if len(report["bad"]) > 20:
        console.print(f"  … and {len(report['bad']) - 20} more")
    if report["bad"]:
        from tvr.search.build import report_file

        where = report_file(out, state)
        console.print(f"[yellow]{len(report['bad'])} unreadable file(s) skipped[/yellow]; report: {where}")


def quiet_libraries() -> None:
    """Library warnings off stderr (transformers' notes on configs and losses, sentence-transformers' deprecations):
    they are about the libraries' own API, nothing a user of tvr can act on; ``tvr --verbose`` keeps them."""
    if _VERBOSE["on"]:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers sets up its logger
    for name in ("transformers", "sentence_transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def hide_weight_loading_bars() -> None:
    """transformers' own "Loading weights" bars off stderr (``tvr --verbose`` keeps them); the hub's download bars
    stay: a first download takes minutes."""
    if _VERBOSE["on"]:
        return
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def quiet_stderr(verbose: bool) -> None:
    """Warnings and errors only on stderr (no INFO lines, no weight-loading bars) unless ``verbose`` (the command's
    ``--verbose`` or the global ``tvr --verbose``): for the commands people run from the shell and read."""
    if verbose or _VERBOSE["on"]:
        return
    logging.getLogger().setLevel(logging.WARNING)
    quiet_libraries()
    # read by huggingface_hub when it is first imported: transformers' "Loading weights" bar goes through it
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _check_search_arguments(
    query: str | None,
    queries: Path | None,
    video: Path | None,
    captions: Path | None,
    k: int,
    rerank: int | None,
    under: str | None = None,
    between: str | None = None,
) -> None:
    """Every argument of ``tvr search`` checked before any model loads: one line naming the bad one."""
    from tvr.search.filters import window_filter
    from tvr.search.index import check_limits, check_query

    given = [name for name, value in (("a query", query), ("--queries", queries), ("--video", video)) if value]
    if len(given) > 1:
        raise UserError(f"give one of a text query, --queries FILE or --video/--captions, not {' and '.join(given)}")
    if (video is None) != (captions is None):
        raise UserError("--video and --captions go together: the clip, and a text file of captions to rank for it")
    if not given:
        raise UserError(
            'give a query: tvr search INDEX "a dog runs on the beach" (or --queries FILE, or --video FILE '
            "--captions FILE)"
        )
    if query is not None:
        check_query(query)
    check_limits(k, rerank)
    if window_filter(under, between) is not None and video is not None:
        raise UserError("--under and --between restrict a text search; --video ranks captions for one clip")
    for flag, path in (("--queries", queries), ("--video", video), ("--captions", captions)):
        if path is not None and str(path) != "-" and not path.is_file():
            raise UserError(f"{flag} {path}: {'is a folder' if path.is_dir() else 'no such file'}; expected a file")
    if video is not None:
        from tvr.data.video import VideoDecodeError, probe_video

        try:
            probe_video(video)
        except VideoDecodeError as exc:
            raise UserError(f"--video {video}: {_decode_problem(exc)}") from None


def _decode_problem(exc: Any) -> str:
    return exc.reason + (f" ({exc.detail})" if exc.detail else "")


def _hit_rows(hits: list) -> list[dict[str, Any]]:
    return [h.to_dict() for h in hits]


def _answer_queries(
    opened: Any, queries: Path, k: int, rerank: int | None, all_windows: bool, under: str | None, between: str | None
) -> int:
    """``--queries FILE`` (``-``: standard input): one query a line (blank lines skipped), answered in batches by one
    loaded model; one JSON line per query on stdout, ``{"query", "hits"}`` or ``{"query", "error"}``. Returns the
    number of queries refused."""
    import json

    from tvr.search.index import QueryError

    lines = sys.stdin.read().splitlines() if str(queries) == "-" else queries.read_text(encoding="utf-8").splitlines()
    texts = [line for line in lines if line.strip()]
    refused = 0
    batch = 64
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        for text, answer in zip(
            chunk,
            opened.search_many(chunk, k=k, rerank=rerank, all_windows=all_windows, under=under, between=between),
            strict=True,
        ):
            if isinstance(answer, QueryError):
                refused += 1
                print(json.dumps({"query": text, "error": str(answer)}), flush=True)
            else:
                print(json.dumps({"query": text, "hits": _hit_rows(answer)}), flush=True)
    if refused:
        say("warning", f"{refused} of {len(texts)} queries refused (their JSON lines say why)", "yellow")
    return refused


INDEX_HELP = "An index made by tvr index: its folder, or its Qdrant address (qdrant://HOST:PORT/COLLECTION, ...)."
STATE_HELP = "Where a Qdrant index's rerank state (its shards) is on this machine, if not where tvr index wrote it."


@app.command("search")
def search_cmd(
    index: str = typer.Argument(..., help=INDEX_HELP),
    query: str | None = typer.Argument(None, help="The text to search for."),
    k: int = typer.Option(search_defaults.DEFAULT_K, "-k", help="Results to return (1 to 1000)."),
    rerank: int | None = typer.Option(
        None, "--rerank", help=f"Windows scored exactly (default {search_defaults.DEFAULT_RERANK}; 0 = none)."
    ),
    all_windows: bool = typer.Option(False, "--all-windows", help="List windows, not one best window per video."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
    queries: Path | None = typer.Option(
        None, "--queries", help="A file of queries, one a line (- = standard input): one JSON line per query."
    ),
    video: Path | None = typer.Option(None, "--video", help="Rank --captions for this clip."),
    captions: Path | None = typer.Option(None, "--captions", help="Captions, one per line."),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", dir_okay=False, help="Where the index's checkpoint is now (if it moved)."
    ),
    model: str | None = typer.Option(None, "--model", help="Where the index's --model folder is now (if it moved)."),
    nprobe: int | None = typer.Option(None, "--nprobe", help="IVF cells probed per query (default: the index's)."),
    ef_search: int | None = typer.Option(
        None, "--ef-search", help="HNSW search beam (default: the index's; larger finds more of the exact top k)."
    ),
    under: str | None = typer.Option(
        None, "--under", help="Only the videos under this folder (or this video), as the index lists them."
    ),
    between: str | None = typer.Option(
        None, "--between", help="Only the windows sharing time with START,END (seconds), e.g. 60,120."
    ),
    state: Path | None = typer.Option(None, "--state", file_okay=False, help=STATE_HELP),
    verbose: bool = typer.Option(False, "--verbose", help="Info messages on stderr (default: warnings and errors)."),
) -> None:
    """Search an index by text (or rank captions for a clip with --video and --captions)."""
    import json

    quiet_stderr(verbose)
    _check_search_arguments(query, queries, video, captions, k, rerank, under, between)
    from tvr.search import open_index

    # text queries without torch when the index's model has a numpy query side (tvr.search.numpy_query)
    opened = open_index(
        index,
        checkpoint=checkpoint,
        nprobe=nprobe,
        ef_search=ef_search,
        without_torch=video is None,
        model=model,
        state=state,
    )
    if queries is not None:
        raise typer.Exit(1 if _answer_queries(opened, queries, k, rerank, all_windows, under, between) else 0)
    if video is not None:
        from tvr.data.video import VideoDecodeError

        try:
            ranked = opened.rank_captions(video, captions.read_text(encoding="utf-8").splitlines())
        except VideoDecodeError as exc:
            raise UserError(f"--video {video}: {_decode_problem(exc)}") from None
        rows = _hit_rows(ranked)[:k]
        columns = ("rank", "score", "caption", "start", "end")
        title = f"captions for {video}"
    else:
        hits = opened.search(query, k=k, rerank=rerank, all_windows=all_windows, under=under, between=between)
        rows = _hit_rows(hits)
        columns = ("rank", "score", "video", "start", "end")
        title = f"{query!r} in {index}"
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(
            *(
                f"{row[c]:.4f}" if c == "score" else f"{row[c]:.1f}" if c in ("start", "end") else str(row[c])
                for c in columns
            )
        )
    stdout_console().print(table)


def listening_socket(host: str, port: int) -> Any:
    """A socket bound to ``host:port`` (SO_REUSEADDR, as uvicorn binds), made before anything slow runs: a busy
    port or a bad address is one line naming it, and nothing can take the port while the model loads."""
    import socket

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: expected 0 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address this machine can listen on ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserError(
            f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); is another server running there? "
            "Pick another with --port"
        ) from None
    return sock


@app.command("serve")
def serve_cmd(
    index: str = typer.Argument(..., help=INDEX_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port"),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", dir_okay=False, help="Where the index's checkpoint is now (if it moved)."
    ),
    model: str | None = typer.Option(None, "--model", help="Where the index's --model folder is now (if it moved)."),
    media_root: Path | None = typer.Option(
        None,
        "--media-root",
        exists=True,
        file_okay=False,
        help="Folder the videos are served from (default: the folder you indexed into INDEX with tvr index).",
    ),
    query_workers: int | None = typer.Option(
        None,
        "--query-workers",
        min=1,
        help="Micro-batches of queries encoded at the same time (default: one per core, at most 8).",
    ),
    state: Path | None = typer.Option(None, "--state", file_okay=False, help=STATE_HELP),
    verbose: bool = typer.Option(False, "--verbose", help="Info messages while loading (default: warnings, errors)."),
) -> None:
    """Serve a search page (/?q=...&k=... links to a search) and a JSON API (GET /api/search?q=...&k=...;
    its OpenAPI description at /openapi.json)."""
    quiet_stderr(verbose)
    sock = listening_socket(host, port)
    import uvicorn

    from tvr.search import open_index
    from tvr.search.server import create_app

    try:
        opened = open_index(index, checkpoint=checkpoint, model=model, state=state)
        app_ = create_app(opened, media_root=media_root, query_workers=query_workers)
        bound = sock.getsockname()[1]  # --port 0: the port the system chose
        console.print(f"videos served from {app_.state.media_root}", highlight=False)
        console.print(f"serving {index} on http://{host}:{bound}/ (API: /api/search, /openapi.json)")
        uvicorn.Server(uvicorn.Config(app_, log_level="info")).run(sockets=[sock])
    except KeyboardInterrupt:  # how a server is stopped: uvicorn shuts down, then raises it again
        if _DEBUG["on"]:
            raise
        say("stopped", SERVE_STOPPED, "yellow")
        raise typer.Exit(130) from None
    finally:
        sock.close()


@app.command("eval-search")
def eval_search_cmd(
    index: str = typer.Argument(..., help=INDEX_HELP),
    queries: Path = typer.Argument(
        ..., dir_okay=False, help="CSV with a header: query,video[,start,end] (video: a path as the index lists it)."
    ),
    ks: list[str] = typer.Option(None, "-k", help="Recall cut-offs, e.g. -k 1,5,10 (the default) or -k 1 -k 50."),
    rerank: int | None = typer.Option(None, "--rerank", help="Windows scored exactly (default 100; 0 = none)."),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="Leave out malformed rows and videos not in the index (listed) instead of stopping."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics and every query's rank as JSON."),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", dir_okay=False, help="Where the index's checkpoint is now (if it moved)."
    ),
    model: str | None = typer.Option(None, "--model", help="Where the index's --model folder is now (if it moved)."),
    ef_search: int | None = typer.Option(None, "--ef-search", help="HNSW search beam (default: the index's)."),
    state: Path | None = typer.Option(None, "--state", file_okay=False, help=STATE_HELP),
) -> None:
    """Measure search on labelled clips: R@k, MdR, MnR and each query's rank, searched as tvr search does."""
    import json

    quiet_libraries()

    from rich.table import Table

    from tvr.search import open_index
    from tvr.search.evaluation import evaluate_search, parse_ks

    cutoffs = parse_ks(ks)
    if rerank is not None and rerank < 0:
        raise UserError(f"--rerank {rerank}: expected an integer >= 0")
    if not queries.is_file():
        found = "not a regular file" if queries.exists() else "no such file"
        raise UserError(f"{queries}: {found}; expected a CSV with the columns query,video[,start,end]")
    opened = open_index(index, checkpoint=checkpoint, ef_search=ef_search, model=model, state=state)
    report = evaluate_search(opened, queries, ks=cutoffs, rerank=rerank, skip_bad=skip_bad)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for problem in report["skipped"]:
        say("skipped", problem, "yellow")
    out = stdout_console()
    ranks = Table(title=f"{report['queries']} queries in {index} ({report['candidates']} {report['unit']}s)")
    for column in ("line", "rank", "query", "video", "top result"):
        ranks.add_column(column)
    for row in report["results"]:
        rank = str(row["rank"]) if row["found"] else f"{row['rank']} (not found)"
        ranks.add_row(str(row["line"]), rank, row["query"], row["video"], str(row["top"]))
    out.print(ranks)
    summary = Table(title="text → video")
    for name in report["metrics"]:
        summary.add_column(name)
    summary.add_row(*(f"{value:.1f}" for value in report["metrics"].values()))
    out.print(summary)
    if report["skipped"]:
        say("skipped", f"{len(report['skipped'])} row(s) of {queries}", "yellow")


def run() -> None:  # pragma: no cover - console entry point helper
    sys.exit(app())


if __name__ == "__main__":  # `python -m tvr.cli ...`, e.g. under torchrun
    run()
