"""A fifth method added as one folder outside tvr (``tests/toy_method/``: head, options, loss, figure, preset)
trains, is evaluated and gets its own ``tvr analyze`` figure through the CLI, with no file of ``tvr/`` changed: the
walk-through of docs/architecture.md ("Add a method")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_end_to_end import make_msrvtt
from typer.testing import CliRunner

from tvr.cli import app

PRESET = Path(__file__).resolve().parent / "toy_method" / "preset.yaml"
HEAD = "toy_method:ToyHead"


def test_a_method_folder_outside_tvr_trains_evaluates_and_draws_its_figure(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    del values["head"]  # the method's preset says which head, and its options
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({"base": str(PRESET), **values}))
    runner = CliRunner()
    run = tmp_path / "run"
    trained = runner.invoke(
        app, ["--trust-code", "train", "--config", str(config), "--out", str(run), "--set", "train.max_steps=2"]
    )
    assert trained.exit_code == 0, trained.output
    saved = yaml.safe_load((run / "config.yaml").read_text())["head"]
    assert saved == {**saved, "name": HEAD, "options": {"proj_dim": 8, "align_weight": 0.5}}
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert all("alignment" in row and "infonce" in row for row in log if "loss" in row)

    metrics = json.loads((run / "test_best" / "metrics.json").read_text())  # tvr train evaluates its best.pt
    assert metrics["head"] == HEAD and metrics["indexable"] is True and metrics["scoring"] == "exhaustive"

    out = tmp_path / "analysis"
    analyzed = runner.invoke(app, ["--trust-code", "analyze", "--checkpoint", str(run / "best.pt"), "--out", str(out)])
    assert analyzed.exit_code == 0, analyzed.output
    manifest = json.loads((out / "analysis.json").read_text())
    assert [f["name"] for f in manifest["figures"]] == ["similarity_distributions", "rank_histogram", "toy_alignment"]
    assert (out / "toy_alignment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    alignment = json.loads((out / "toy_alignment.json").read_text())["alignment"]
    positives = json.loads((out / "similarity_distributions.json").read_text())["positive"]
    # unit embeddings: ‖t − v‖² = 2 − 2·cos, so the toy's figure and the shared one read the same pairs
    assert len(alignment) == manifest["num_texts"] == positives["count"]
    assert sum(alignment) / len(alignment) == pytest.approx(2.0 - 2.0 * positives["mean"], abs=1e-5)


def test_a_head_without_figures_gets_the_shared_ones_only() -> None:
    from tvr.analysis.checkpoint import method_figures
    from tvr.methods.clip4clip import Clip4ClipHead

    assert Clip4ClipHead.analysis_figures is None
    assert method_figures(_Context(Clip4ClipHead(8))) == []


def test_a_figures_module_is_named_relative_to_a_package_or_in_full() -> None:
    from toy_heads import BilinearHead

    from tvr.analysis.checkpoint import method_figures

    class Relative(BilinearHead):
        analysis_figures = ".figures"

    class Missing(BilinearHead):
        analysis_figures = "toy_method.losses"  # a module without write_figures

    Relative.__module__ = Missing.__module__ = "toy_heads"  # a top-level module: nothing to be relative to
    with pytest.raises(ValueError, match=r"analysis_figures = '.figures' is relative.*'toy_heads' is in no package"):
        method_figures(_Context(Relative(8)))
    with pytest.raises(TypeError, match="module toy_method.losses has no write_figures"):
        method_figures(_Context(Missing(8)))


class _Context:
    def __init__(self, head: object) -> None:
        self.head = head
