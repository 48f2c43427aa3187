"""``tvr demo``: synthesise a captioned video set, train a small CLIP4Clip on CPU, evaluate, print the table.

Everything is real except the scale: real mp4 files decoded with PyAV, the real CLIP architecture (randomly
initialised, small), the seqTransf temporal module, the paper's loss and metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

from tvr.bench.synthetic import SynthConfig
from tvr.config import Config, check_import_trusted, config_from_dict, preset_values
from tvr.models.heads.registry import head_class
from tvr.models.run_spec import resolve_run
from tvr.utils.data_files import DataFileError, read_json, read_yaml
from tvr.utils.errors import UserError

log = logging.getLogger(__name__)
#: the file of a synthetic set that records its generation settings
SYNTH_META = "synth_meta.json"

#: the demo's recipe, a preset a user can train as well (tvr/configs/cpu/clip4clip.yaml); ``--method`` changes the head
DEMO_PRESET = "cpu/clip4clip"

#: what the demo's small validation split (a tenth of its training videos) means, said instead of the warning a run
#: on real data gets
DEMO_VALIDATION = (
    "the demo's choice (a tenth of its training videos), so that each validation takes seconds; best.pt is picked "
    "on this coarse signal, enough to show model selection at work, and the test split is read once at the end; a "
    "run on real data holds out 100 videos or more"
)

QUICK_OVERRIDES: dict[str, Any] = {"train": {"epochs": 1, "max_steps": 4, "log_every": 1}}


def demo_config(data_dir: Path, quick: bool = False, method: str = "clip4clip") -> Config:
    """The demo's run config: :data:`DEMO_PRESET` on ``data_dir`` with ``method``'s head (its ``demo_options``; a head
    that reads video proxies on the CLIP-ViP tower). For the four shipped heads it equals ``cpu/<method>``."""
    values = preset_values(DEMO_PRESET)
    values["data"]["annotations"] = str(data_dir)
    values["data"]["video_dir"] = str(data_dir / "videos")
    values["head"]["name"] = method
    check_import_trusted(method, "--method")
    head = head_class(method)
    values["head"]["options"] = dict(head.demo_options)
    if "proxies" in head.requires:
        # a head that reads per-video proxies runs on the CLIP-ViP tower (same tiny CLIP), which pools the video
        # itself (no temporal module) and brings CLIP-ViP's frame sampling with it
        values["model"].update(
            {
                "backbone": "clipvip",
                "temporal": "none",
                "clipvip": {"num_proxies": 4, "temporal_slots": 12, "proxy_projection": True},
            }
        )
    if quick:
        for section, entries in QUICK_OVERRIDES.items():
            values[section].update(entries)
    return resolve_run(config_from_dict(values)).config


def demo_synth_config(quick: bool) -> SynthConfig:
    """The synthetic set a demo trains on: 60 videos for ``--quick``, 240 otherwise (more distinct videos
    generalise better than more epochs over fewer: docs/benchmarks.md)."""
    return SynthConfig(num_videos=60, num_test=20) if quick else SynthConfig(num_videos=240, num_test=30)


def _recorded_synth(data_dir: Path) -> dict[str, Any] | None:
    """The generation settings a demo data folder records (``synth_meta.json``), None when it records none."""
    try:
        meta = read_json(data_dir / SYNTH_META)
    except (OSError, DataFileError):
        return None
    config = meta.get("config") if isinstance(meta, dict) else None
    return config if isinstance(config, dict) else None


def prepare_demo_data(data_dir: Path, synth: SynthConfig) -> None:
    """Make ``data_dir`` hold the synthetic set ``synth`` describes: reuse a set generated with exactly these
    settings, else (re)generate it, saying what is replaced (e.g. the quick demo's 60 videos before the full
    demo). A folder that holds something other than a demo set (or an interrupted one) is not touched."""
    from tvr.bench.synthetic import generate_synthetic_dataset

    wanted = dataclasses.asdict(synth)
    recorded = _recorded_synth(data_dir)
    if recorded == wanted and (data_dir / "MSRVTT_data.json").is_file():
        log.info("reusing the synthetic set in %s (%d videos)", data_dir, synth.num_videos)
        return
    if data_dir.exists():
        if recorded is None and not _interrupted_demo_set(data_dir):
            raise UserError(
                f"demo data folder {data_dir} holds files that are not a tvr demo set; choose another --out"
            )
        if recorded is None:
            what = "an interrupted generation"
        else:
            changed = [f"{k} {recorded.get(k)!r} → {v!r}" for k, v in wanted.items() if recorded.get(k) != v]
            what = f"a set generated with other settings ({', '.join(changed)})"
        log.warning("regenerating the synthetic set in %s: it held %s", data_dir, what)
        shutil.rmtree(data_dir)
    generate_synthetic_dataset(data_dir, synth, progress=True)


def _interrupted_demo_set(data_dir: Path) -> bool:
    """Only what an interrupted :func:`generate_synthetic_dataset` leaves: ``videos/`` with clips and temporaries,
    nothing else."""
    entries = list(data_dir.iterdir())
    if any(entry.name != "videos" for entry in entries):
        return False
    videos = data_dir / "videos"
    return not videos.exists() or all(
        f.is_file() and (f.suffix == ".mp4" or f.name.endswith(".tmp")) for f in videos.iterdir()
    )


def _describe_run(run_dir: Path) -> str:
    """A few words on a previous demo run (head, quick or full), from its config.yaml."""
    try:
        values = read_yaml(run_dir / "config.yaml") or {}
        head = values["head"]["name"]
        steps = values["train"].get("max_steps") or 0
    except (OSError, DataFileError, KeyError, TypeError):
        return "a run whose config.yaml cannot be read"
    kind = f"quick, {steps} steps" if steps else f"{values['train'].get('epochs')} epochs"
    return f"head {head}, {kind}"


def run_demo(out_dir: str | Path = "demo_out", quick: bool = False, method: str = "clip4clip") -> dict:
    from tvr.pipeline import run_train

    out_dir = Path(out_dir)
    data_dir = out_dir / "data"
    cfg = demo_config(data_dir, quick=quick, method=method)  # first: an unknown method fails before any work
    prepare_demo_data(data_dir, demo_synth_config(quick))
    run_dir = out_dir / "run"
    if any((run_dir / name).exists() for name in ("config.yaml", "last.pt", "best.pt")):
        # the demo always starts over; say which run's files go
        log.warning("replacing the previous demo run in %s (%s)", run_dir, _describe_run(run_dir))
    return run_train(cfg, run_dir, overwrite=True, small_val_reason=DEMO_VALIDATION)
