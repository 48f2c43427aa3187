"""``tvr plot`` and ``tvr analyze`` end to end: a tiny real run (tiny mp4s, tiny CLIP, GARE head), its curves, and the
analyses of GARE, TV-ProxyNet and GraviAlign checkpoints through the pinned command lines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from annotation_fixtures import write_msrvtt
from PIL import Image
from typer.testing import CliRunner
from videos import write_test_video

from tvr.analysis import AnalysisOptions
from tvr.analysis.figures import DPI
from tvr.analysis.papers import GARE_PAPER, TEXT_PROXY_PAPER
from tvr.cli import app
from tvr.config import config_from_dict
from tvr.models.build import build_model
from tvr.models.run_spec import resolve_run
from tvr.pipeline import run_train
from tvr.pipeline.analyze import run_analyze
from tvr.train.checkpoint import save_checkpoint
from tvr.utils.data_files import read_jsonl

TINY = {
    "embed_dim": 32,
    "text_width": 32,
    "text_layers": 1,
    "text_heads": 2,
    "vision_width": 32,
    "vision_layers": 1,
    "vision_heads": 2,
    "image_size": 32,
    "patch_size": 16,
}
ANY_HEAD = ["similarity_distributions", "rank_histogram"]
FIGURES = {
    "gare": ANY_HEAD
    + [
        "gare_gradient_tension",
        "gare_delta_gradients",
        "gare_gradient_cancellation",
        "gare_delta_geometry",
        "gare_hard_negatives",
    ],
    "proxy": ANY_HEAD + ["proxy_gamma_sweep", "proxy_feature_space", "proxy_query_correlation"],
    "gravialign": ANY_HEAD + ["gravialign_uncertainty", "gravialign_terms", "gravialign_modes"],
}


def tiny_values(root: Path, head: str) -> dict:
    values = {
        "data": {
            "dataset": "msrvtt",
            "annotations": str(root),
            "video_dir": str(root / "videos"),
            "max_words": 16,
            "max_frames": 4,
            "frame_rate": 2.0,
            "image_size": 32,
            "val_fraction": 0.3,
        },
        "model": {"clip": "tiny", "temporal": "seqTransf", "temporal_layers": 1, "tiny": TINY},
        "head": {"name": head},
        "train": {
            "epochs": 2,
            "batch_size": 4,
            "lr": 1e-3,
            "backbone_lr_coef": 1.0,
            "log_every": 1,
            "device": "cpu",
            "num_threads": 1,
        },
        "eval": {"batch_size": 8},
    }
    if head == "proxy":
        values["model"].update(
            {
                "backbone": "clipvip",
                "temporal": "none",
                "clipvip": {"num_proxies": 4, "temporal_slots": 4, "proxy_projection": True},
            }
        )
        values["data"]["sampling"] = "clipvip"
        values["head"]["options"] = {"ffn_dim": 16, "gamma": 0.3}
    return values


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("analysis_data")
    vids = [f"video{k}" for k in range(14)]
    write_msrvtt(root, vids, captions_per_video=2, test_ids=vids[10:])
    (root / "videos").mkdir()
    for k, vid in enumerate(vids):
        write_test_video(root / "videos" / f"{vid}.mp4", num_frames=5 + k % 3, fps=4, size=(32, 32))
    return root


@pytest.fixture(scope="module")
def gare_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real two-epoch GARE run and its config file."""
    work = tmp_path_factory.mktemp("gare_run")
    values = tiny_values(data_root, "gare")
    config = work / "gare.yaml"
    config.write_text(yaml.safe_dump(values))
    run_train(config_from_dict(values), work / "run", final_test=False)
    return work / "run", config


def png(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.load()
        return image.size


def test_plot_writes_every_curve_with_its_numbers(gare_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = gare_run
    other = tmp_path / "second" / "run"
    shutil.copytree(run, other)
    out = tmp_path / "plots"
    result = CliRunner().invoke(app, ["plot", str(run), str(other), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "plots.json").read_text())
    names = [f["name"] for f in manifest["figures"]]
    assert names == ["training_losses", "learning_rates", "validation"]
    assert manifest["skipped"] == ["inference_setting"]  # GARE has no free inference setting
    assert [r["label"] for r in manifest["runs"]] == [f"{run.parent.name}/run", "second/run"]
    for figure in manifest["figures"]:
        width, height = png(out / figure["png"])
        assert width >= 6 * DPI and height >= 3 * DPI
        assert (out / figure["csv"]).read_text().count("\n") > 2
    # the numbers behind the curves are the logs' own
    train = [r for r in read_jsonl(run / "train_log.jsonl") if r["kind"] == "train"]
    losses = json.loads((out / "training_losses.json").read_text())
    label = manifest["runs"][0]["label"]
    assert [p[1] for p in losses["series"]["loss"][label]] == [r["loss"] for r in train]
    assert {"loss", "infonce", "kl", "direction", "radius", "grad_norm"} <= set(losses["series"])
    validation = json.loads((out / "validation.json").read_text())
    val = read_jsonl(run / "val_log.jsonl")
    assert [p[1] for p in validation["series"][label]["t2v"]["R1"]] == [r["metrics"]["t2v"]["R1"] for r in val]
    assert manifest["runs"][0]["steps_per_epoch"] == train[-1]["step"] / 2  # two epochs
    lrs = json.loads((out / "learning_rates.json").read_text())
    assert set(lrs["series"][label]) == set(train[0]["lr"])


def test_plot_says_why_a_run_has_no_training_curve_and_marks_a_lone_validation(
    gare_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of 7 steps with train.log_every 10 logged no training record and validated once: the terminal and the
    figure say why its training curve is missing, and its one validation point is drawn as a visible marker."""
    run, _ = gare_run
    short = tmp_path / "short"
    short.mkdir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["log_every"] = 10
    (short / "config.yaml").write_text(yaml.safe_dump(config))
    validation = {**read_jsonl(run / "val_log.jsonl")[0], "step": 7, "epoch": 1}
    (short / "val_log.jsonl").write_text(json.dumps(validation) + "\n")
    (short / "train_log.jsonl").write_text(json.dumps({"kind": "eval", **validation}) + "\n")
    why = "short: no training loss logged: it trained 7 step(s) and logs one record every train.log_every = 10 steps"

    import tvr.analysis.curves

    drawn: dict[str, tuple[str, list]] = {}  # name: (title, [(points, marker, size) of every line]), before writing
    write = tvr.analysis.curves.write_figure

    def record(out: Path, name: str, fig, *args, **kwargs):
        lines = [
            (len(line.get_xdata()), line.get_marker(), line.get_markersize())
            for ax in fig.axes
            for line in ax.get_lines()
        ]
        drawn[name] = (fig._suptitle.get_text(), lines)
        return write(out, name, fig, *args, **kwargs)

    monkeypatch.setattr(tvr.analysis.curves, "write_figure", record)
    out = tmp_path / "alone"
    result = CliRunner().invoke(app, ["plot", str(short), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert why in " ".join(result.output.split())
    manifest = json.loads((out / "plots.json").read_text())
    assert manifest["skipped"] == ["training_losses", "learning_rates", "inference_setting"]
    assert manifest["notes"] == [why + " (lower it to see curves)"]
    lone = [(marker, size) for points, marker, size in drawn["validation"][1] if points == 1]
    assert len(lone) == 6  # R@1, R@5, R@10 in both directions, one point each
    assert all(marker not in (None, "None", "") and size >= 6 for marker, size in lone)
    assert len({marker for marker, _ in lone}) == 3  # equal recalls overlap: the shapes tell them apart

    out = tmp_path / "both"
    result = CliRunner().invoke(app, ["plot", str(run), str(short), "--out", str(out)])
    assert result.exit_code == 0, result.output
    figure = json.loads((out / "training_losses.json").read_text())
    assert figure["notes"] == [why + " (lower it to see curves)"]
    assert why in drawn["training_losses"][0]


def test_plot_refuses_what_is_not_a_run_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plot", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no train_log.jsonl or val_log.jsonl" in result.output
    (tmp_path / "train_log.jsonl").write_text('{"kind": "train", "step": 1}\nnot json\n{"step": 2}\n')
    result = CliRunner().invoke(app, ["plot", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "train_log.jsonl:2: not valid JSON" in result.output


def test_analyze_a_gare_checkpoint_on_val_and_test(gare_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, config = gare_run
    out = tmp_path / "val"
    result = CliRunner().invoke(
        app, ["analyze", "--checkpoint", str(run / "best.pt"), "--config", str(config), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "analysis.json").read_text())
    assert [f["name"] for f in manifest["figures"]] == FIGURES["gare"]
    assert manifest["split"] == "val" and manifest["head"] == "gare"
    for figure in manifest["figures"]:
        width, height = png(out / figure["png"])
        assert width >= 7 * DPI and height >= 4 * DPI
        assert figure["title"].endswith("val split")
        assert json.loads((out / figure["json"]).read_text())["split"] == "val"
    # the rank histogram's recall is the evaluation's
    ranks = json.loads((out / "rank_histogram.json").read_text())
    assert ranks["t2v"]["metrics"]["R1"] == pytest.approx(manifest["metrics"]["t2v"]["R1"])
    geometry = json.loads((out / "gare_delta_geometry.json").read_text())
    assert geometry["positive"]["angle"]["count"] == manifest["num_texts"]

    out = tmp_path / "test"
    result = CliRunner().invoke(
        app,
        [
            "analyze",
            "--checkpoint",
            str(run / "best.pt"),
            "--config",
            str(config),
            "--out",
            str(out),
            "--split",
            "test",
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "analysis.json").read_text())
    assert manifest["num_videos"] == 4
    assert all("test split — for reading only, not for model selection" in f["title"] for f in manifest["figures"])

    result = CliRunner().invoke(
        app,
        [
            "analyze",
            "--checkpoint",
            str(run / "best.pt"),
            "--config",
            str(config),
            "--out",
            str(tmp_path / "x"),
            "--split",
            "dev",
        ],
    )
    assert result.exit_code == 2 and "--split 'dev'" in result.output


def test_analyze_needs_nothing_but_the_checkpoint(gare_run: tuple[Path, Path], tmp_path: Path) -> None:
    """As ``tvr eval``: the checkpoint carries its config; ``--set`` changes it, ``--config`` replaces it."""
    run, config = gare_run
    alone = tmp_path / "alone"
    result = CliRunner().invoke(app, ["analyze", "--checkpoint", str(run / "best.pt"), "--out", str(alone)])
    assert result.exit_code == 0, result.output
    with_file = tmp_path / "with_file"
    result = CliRunner().invoke(
        app, ["analyze", "--checkpoint", str(run / "best.pt"), "--config", str(config), "--out", str(with_file)]
    )
    assert result.exit_code == 0, result.output
    manifests = [json.loads((out / "analysis.json").read_text()) for out in (alone, with_file)]
    assert [f["name"] for f in manifests[0]["figures"]] == FIGURES["gare"]
    # the figures of a paper name it and its figure, as a reader can look them up (not this repository's seed files)
    titles = {f["name"]: f["title"] for f in manifests[0]["figures"]}
    for name, figure in (
        ("gare_gradient_tension", "Fig. 2 and 7"),
        ("gare_delta_gradients", "Fig. 4"),
        ("gare_delta_geometry", "Fig. 3"),
        ("gare_hard_negatives", "Fig. 6"),
    ):
        assert f"as {figure} of {GARE_PAPER}" in titles[name]
    assert not any("seed 0" in title for title in titles.values())
    assert manifests[0]["metrics"] == manifests[1]["metrics"] and manifests[0]["num_texts"] == manifests[1]["num_texts"]

    # --set changes the carried config: a folder with no videos is the error of that setting, not a missing --config
    result = CliRunner().invoke(
        app,
        ["analyze", "--checkpoint", str(run / "best.pt"), "--out", str(tmp_path / "x")]
        + ["--set", f"data.video_dir={tmp_path / 'nowhere'}"],
    )
    assert result.exit_code == 2 and "nowhere" in result.output and "--config" not in result.output


@pytest.mark.parametrize("head", ["proxy", "gravialign"])
def test_analyze_proxy_and_gravialign_checkpoints(head: str, data_root: Path, tmp_path: Path) -> None:
    cfg = config_from_dict(tiny_values(data_root, head))
    from tvr.pipeline import resolve_config

    cfg = resolve_config(cfg)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint, build_model(resolve_run(cfg)))
    out = tmp_path / "analysis"
    manifest = run_analyze(cfg, checkpoint, out, split="test", options=AnalysisOptions(max_captions=3))
    assert [f["name"] for f in manifest["figures"]] == FIGURES[head]
    for figure in manifest["figures"]:
        assert png(out / figure["png"])[0] >= 7 * DPI
        assert "not for model selection" in figure["title"]
    assert not any("seed 0" in f["title"] for f in manifest["figures"])
    if head == "proxy":
        space = next(f["title"] for f in manifest["figures"] if f["name"] == "proxy_feature_space")
        assert f"as appendix Fig. 5 of {TEXT_PROXY_PAPER}" in space
        sweep = json.loads((out / "proxy_gamma_sweep.json").read_text())
        assert sweep["for_model_selection"] is False and sweep["stored_gamma"] == pytest.approx(0.3)
        assert (out / "proxy_gamma_sweep.csv").is_file()
        assert len(json.loads((out / "proxy_query_correlation.json").read_text())["positive"]) == 3
    else:
        modes = json.loads((out / "gravialign_modes.json").read_text())
        assert modes["chosen"] == {"mode": "cos_f"}
        terms = json.loads((out / "gravialign_terms.json").read_text())
        assert len(terms["positive"]["A"]) == 3 and len(terms["negative"]["A"]) == 3 * 3  # 4 test videos: 3 negatives
