"""The bench's regime, controls and selection (issue 49): the CLIP-like projection equalises the modalities' scales,
feature norms are what a hand computation gives, every method is paired with its own control with Holm over the whole
table, selection on mean/R1 records what each direction alone would have chosen, and H4's test is a paired one-sided
t test of the two regimes' gains."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tvr.bench.report import control_differences_table, direction_selection_table, norms_table, render_markdown
from tvr.bench.results_document import all_hypotheses, fill_template
from tvr.bench.runs import (
    BENCH_PRESET_DIR,
    BenchConfigError,
    compare_with_controls,
    direction_choices,
    load_bench_config,
    method_config,
    prepare_data,
    prepare_features,
    run_one,
    summarize,
)
from tvr.bench.stats import holm, paired_difference, paired_t_test, t_interval, t_test_p
from tvr.config import ConfigError, load_config
from tvr.eval.feature_norms import feature_norms
from tvr.models.backbones.two_tower.bridge import PROJECTION_KINDS, ProjectionBridge
from tvr.models.backbones.two_tower.config import TwoTowerConfig
from tvr.train.logging import VAL_JSONL
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.metric_paths import higher_is_better, lookup_metric

REPO = Path(__file__).resolve().parents[1]
QUICK = BENCH_PRESET_DIR / "quick.yaml"
METRICS = ("R1", "R5", "R10", "MdR", "MnR")

# --------------------------------------------------------------------------------------------- the regime


def test_the_clip_projection_is_a_layernorm_then_a_bias_free_map() -> None:
    torch.manual_seed(0)
    bridge = ProjectionBridge(12, 40, 16, "clip")
    ln, proj = bridge.image_proj.net
    assert isinstance(ln, torch.nn.LayerNorm) and proj.bias is None and proj.weight.shape == (16, 40)
    frames = torch.randn(3, 5, 40)
    expected = torch.nn.functional.layer_norm(frames, (40,)) @ proj.weight.T
    out = bridge.video(VideoFeatures(frames, torch.ones(3, 5, dtype=torch.long))).frames
    torch.testing.assert_close(out, expected)
    # CLIP's initialisation: N(0, in_dim^-1/2), so a standardised input maps to about unit variance per dimension
    assert abs(proj.weight.std().item() - 40**-0.5) < 0.02


def test_the_clip_projection_hands_both_modalities_comparable_scales() -> None:
    """Towers at the scales MiniLM and EfficientNet give (a unit sentence embedding, frames of norm ~60): a linear
    map carries the ratio through; CLIP's ending brings both to about √D whatever the tower's scale."""
    torch.manual_seed(1)
    text = TextFeatures(torch.nn.functional.normalize(torch.randn(64, 384), dim=-1))
    frames = torch.relu(torch.randn(64, 4, 1280)) * 2.0
    video = VideoFeatures(frames, torch.ones(64, 4, dtype=torch.long))
    ratios = {}
    for kind in ("linear", "clip"):
        bridge = ProjectionBridge(384, 1280, 256, kind)
        t = bridge.text(text).eot.norm(dim=-1).mean()
        v = bridge.video(video).frames.norm(dim=-1).mean()
        ratios[kind] = (v / t).item()
    assert ratios["linear"] > 10 and 0.7 < ratios["clip"] < 1.4, ratios
    # the ending makes a tower's scale irrelevant: 100 times the features give the same shared-space vectors
    bridge = ProjectionBridge(384, 1280, 256, "clip")
    scaled = VideoFeatures(100.0 * frames, video.frame_mask)
    torch.testing.assert_close(bridge.video(scaled).frames, bridge.video(video).frames, rtol=1e-4, atol=1e-4)


def test_projection_kinds_are_the_configs_choices() -> None:
    import dataclasses

    field = next(f for f in dataclasses.fields(TwoTowerConfig) if f.name == "projection")
    assert field.metadata["choices"] == PROJECTION_KINDS


def test_the_default_bench_is_the_clip_like_regime_and_default_linear_only_differs_there() -> None:
    new, old = (yaml.safe_load((BENCH_PRESET_DIR / f"{n}.yaml").read_text()) for n in ("default", "default_linear"))
    assert new["run"]["model"]["two_tower"]["projection"] == "clip"
    assert old["run"]["model"]["two_tower"]["projection"] == "linear"
    for raw in (new, old):
        raw["run"]["model"]["two_tower"].pop("projection")
        raw.pop("name")
        raw.pop("description")
    assert new == old
    assert new["run"]["train"]["select_metric"] == "mean/R1"


# --------------------------------------------------------------------------------------------- feature norms


def test_feature_norms_match_a_hand_computation() -> None:
    text = TextFeatures(torch.tensor([[3.0, 4.0], [0.0, 1.0]]))  # norms 5 and 1
    frames = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [9.0, 9.0]], [[0.0, 6.0], [8.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the third slots are padding and count nowhere
    norms = feature_norms(text, VideoFeatures(frames, mask))
    assert norms["text"]["mean"] == pytest.approx(3.0) and norms["text"]["sd"] == pytest.approx(math.sqrt(8.0))
    assert norms["frame"]["mean"] == pytest.approx((2 + 2 + 6 + 8) / 4) and norms["frame"]["n"] == 4
    # per-video means (1, 1) and (4, 3): norms √2 and 5
    assert norms["video_mean"]["mean"] == pytest.approx((math.sqrt(2) + 5) / 2)
    assert norms["video_to_text"] == pytest.approx(((math.sqrt(2) + 5) / 2) / 3.0)


# --------------------------------------------------------------------------------------------- selection


def test_mean_of_both_directions_is_a_select_metric() -> None:
    metrics = {"t2v": {"R1": 30.0, "MdR": 4.0}, "v2t": {"R1": 10.0, "MdR": 8.0}}
    assert lookup_metric(metrics, "mean/R1") == 20.0 and lookup_metric(metrics, "mean/MdR") == 6.0
    assert higher_is_better("mean/R1") and not higher_is_better("mean/MdR")
    assert load_config("two_tower/msrvtt", ["train.select_metric=mean/R1"]).train.select_metric == "mean/R1"
    with pytest.raises(ConfigError, match=r"select_metric = 'mean/R0': expected one of"):
        load_config("two_tower/msrvtt", ["train.select_metric=mean/R0"])


def _val_record(epoch: int, candidates: list[tuple[dict, float, float]]) -> dict:
    selection = [{"setting": s, "t2v": {"R1": a}, "v2t": {"R1": b}} for s, a, b in candidates]
    best = max(selection, key=lambda c: (c["t2v"]["R1"] + c["v2t"]["R1"]) / 2)
    return {"epoch": epoch, "step": 10 * epoch, "metrics": {"t2v": best["t2v"], "v2t": best["v2t"],
            "info": {"inference_setting": best["setting"], "inference_selection": selection}}}  # fmt: skip


def test_direction_choices_read_every_candidate_of_every_validation(tmp_path: Path) -> None:
    """A mode that is best from text to video wrecks video to text: the mean picks the balanced one, and the
    record keeps what each direction alone would have picked."""
    records = [
        _val_record(1, [({"mode": "a"}, 20.0, 18.0), ({"mode": "b"}, 24.0, 4.0)]),
        _val_record(2, [({"mode": "a"}, 22.0, 21.0), ({"mode": "b"}, 30.0, 3.0)]),
        _val_record(3, [({"mode": "a"}, 21.0, 22.0), ({"mode": "b"}, 25.0, 2.0)]),
    ]
    (tmp_path / VAL_JSONL).write_text("".join(json.dumps(r) + "\n" for r in records))
    choices = direction_choices(tmp_path, "mean/R1")
    assert choices["mean/R1"] == {"epoch": 2, "step": 20, "value": 21.5, "inference_setting": {"mode": "a"}}
    assert choices["t2v/R1"] == {"epoch": 2, "step": 20, "value": 30.0, "inference_setting": {"mode": "b"}}
    assert choices["v2t/R1"] == {"epoch": 3, "step": 30, "value": 22.0, "inference_setting": {"mode": "a"}}


@pytest.fixture(scope="module")
def quick_mean(tmp_path_factory: pytest.TempPathFactory):
    """The quick bench with selection on mean/R1: its data, feature cache and one GraviAlign run."""
    out = tmp_path_factory.mktemp("bench")
    raw = yaml.safe_load(QUICK.read_text())
    raw["run"]["train"]["select_metric"] = "mean/R1"
    path = out / "bench.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    bench = load_bench_config(path)
    prepare_data(bench, out, progress=False)
    method = next(m for m in bench.methods if m.name == "gravialign")
    cache = prepare_features(method_config(bench, method, 42, out), out, progress=False)
    cfg = method_config(bench, method, 5, out, str(cache))
    return cfg, run_one(cfg, out / "run")


def test_a_run_records_its_choices_per_direction_and_its_feature_norms(quick_mean) -> None:
    cfg, result = quick_mean
    own = result["selection_by_direction"]["mean/R1"]
    assert own["step"] == result["best_step"] and own["inference_setting"] == result["inference_setting"]
    assert set(result["selection_by_direction"]) == {"mean/R1", "t2v/R1", "v2t/R1"}
    for when in ("init", "best"):
        norms = result["feature_norms"][when]
        assert norms["text"]["n"] == norms["video_mean"]["n"] > 0 and norms["video_to_text"] > 0
    # the initial model is the one training started from: building it again gives the same norms
    from tvr.bench.runs import initial_model, validation_norms

    device = torch.device("cpu")
    again = validation_norms(cfg, initial_model(cfg).eval(), device)
    assert again == result["feature_norms"]["init"]


# --------------------------------------------------------------------------------------------- controls


def _runs(values: dict[str, list[float]], at_setting: list[float] | None = None) -> dict[str, list[dict]]:
    def run(seed: int, value: float, extra: float | None) -> dict:
        test = {d: dict.fromkeys(METRICS, value) for d in ("t2v", "v2t")}
        if extra is not None:
            test.update({f"{d}@gamma=0": dict.fromkeys(METRICS, extra) for d in ("t2v", "v2t")})
        return {"seed": seed, "test": test}

    return {
        name: [run(k, v, at_setting[k] if at_setting and name == "proxy" else None) for k, v in enumerate(vs)]
        for name, vs in values.items()
    }


def test_each_method_is_paired_with_its_own_control_and_holm_covers_the_whole_table() -> None:
    values = {"base": [10.0, 12.0, 14.0], "gare": [9.0, 13.0, 16.0], "gare-control": [10.0, 11.0, 13.0],
              "proxy": [12.0, 15.0, 15.0]}  # fmt: skip
    runs = _runs(values, at_setting=[11.0, 14.0, 14.5])
    summary, differences = summarize(runs, "base")
    controls = compare_with_controls(runs, differences, {"gare": "gare-control", "proxy": "@gamma=0", "base": ""})
    assert set(controls) == {"gare", "proxy"} and controls["proxy"]["control"] == "@gamma=0"
    gare = controls["gare"]["differences"]["t2v"]["R1"]
    expected = paired_difference(values["gare"], values["gare-control"])
    assert gare["mean"] == pytest.approx(expected.mean) and gare["p"] == pytest.approx(
        paired_t_test(values["gare"], values["gare-control"]))  # fmt: skip
    proxy = controls["proxy"]["differences"]["v2t"]["MnR"]
    assert proxy["mean"] == pytest.approx(t_interval([1.0, 1.0, 0.5]).mean)
    # Holm over every cell of both tables together (3 methods × 10 against the baseline, 2 × 10 against controls)
    cells = [differences[m][d][k] for m in differences for d in ("t2v", "v2t") for k in METRICS]
    cells += [controls[m]["differences"][d][k] for m in controls for d in ("t2v", "v2t") for k in METRICS]
    assert len(cells) == 50
    for cell, adjusted in zip(cells, holm([c["p"] for c in cells]), strict=True):
        assert cell["p_holm"] == pytest.approx(adjusted)
    text = control_differences_table({"controls": controls, "baseline": "base"})
    assert "| gare − gare-control |" in text and "| proxy − proxy at gamma=0 |" in text


@pytest.mark.parametrize(
    ("control", "message"),
    [("nope", "'nope' is not another method"), ("gravialign", "not another method"),
     ("@gamma=0", r"not a baseline setting of the gravialign head \(it has \['@cos_f'\]\)")],
)  # fmt: skip
def test_a_control_that_names_nothing_is_refused(tmp_path: Path, control: str, message: str) -> None:
    raw = yaml.safe_load(QUICK.read_text())
    raw["methods"][1]["control"] = control
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(BenchConfigError, match=message):
        load_bench_config(path)


def test_shipped_controls_resolve() -> None:
    bench = load_bench_config("default")
    controls = {m.name: m.control for m in bench.methods if m.control}
    gravi = "gravialign-control"
    assert controls == {"gare": "gare-control", "tv-proxynet": "@gamma=0", "gravialign": gravi,
                        "gravialign-guarded": gravi, "gravialign-contrastive": gravi}  # fmt: skip
    gare_control = next(m for m in bench.methods if m.name == "gare-control")
    assert gare_control.head["name"] == "clip4clip" and gare_control.head["options"]["video_pool"] == "text_softmax"
    gravi = next(m for m in bench.methods if m.name == "gravialign-control").head["options"]
    assert (gravi["alpha"], gravi["select_modes"], gravi["inference_mode"]) == (0.0, "", "cos_f")


# --------------------------------------------------------------------------------------------- reports


def _results_with_everything() -> dict:
    values = {"base": [10.0, 12.0, 14.0], "gare": [9.0, 13.0, 16.0], "gare-control": [10.0, 11.0, 13.0]}
    runs = _runs(values)
    summary, differences = summarize(runs, "base")
    controls = compare_with_controls(runs, differences, {"gare": "gare-control"})
    norms = {w: {"text": {"mean": 1.0}, "video_mean": {"mean": 4.0}, "video_to_text": 4.0} for w in ("init", "best")}
    flat = [{**r, "method": m, "best_epoch": 1, "best_step": 5, "inference_setting": None, "feature_norms": norms,
             "selection_by_direction": {"mean/R1": {"epoch": 1, "step": 5, "value": 1.0, "inference_setting": None},
                                        "t2v/R1": {"epoch": 2, "step": 9, "value": 1.0, "inference_setting": None},
                                        "v2t/R1": {"epoch": 1, "step": 5, "value": 1.0, "inference_setting": None}},
             "val_curve": [{"epoch": 1, "t2v": {"R1": 1.0}, "v2t": {"R1": 2.0}}]}
            for m, rs in runs.items() for r in rs]  # fmt: skip
    return {
        "name": "t", "description": "", "baseline": "base", "seeds": [0, 1, 2], "epochs": 2,
        "methods": [{"name": m} for m in values], "config": {"synth": {}}, "summary": summary,
        "differences": differences, "controls": controls, "runs": flat, "select_metric": "mean/R1",
        "selection": "Checkpoint: best validation mean/R1", "composition": {}, "provenance": {},
    }  # fmt: skip


def test_reports_show_controls_norms_and_per_direction_choices(tmp_path: Path) -> None:
    results = _results_with_everything()
    text = render_markdown(results)
    assert "own control" in text and "| gare − gare-control |" in text
    assert "| gare | 1.00 | 4.00 | 4.00 | 1.00 | 4.00 | 4.00 |" in norms_table(results)
    assert "| gare | 1, 1, 1 | 2, 2, 2 | 1, 1, 1 |" in direction_selection_table(results)
    # a further bench named on the command line gets the same tables under its own name
    doc = fill_template("{{table:old.controls}}\n{{old_derived.n_control_comparisons}}\n{{figure:old.val}}", results,
                        {}, tmp_path, extra={"old": results})  # fmt: skip
    assert "| gare − gare-control |" in doc and "\n10\n" in doc and (tmp_path / "old_val_r1.png").is_file()


def test_hypotheses_decided_with_holm_over_the_whole_family() -> None:
    sweep = {"hypotheses": [{"id": "H1", "p_one_sided": 0.01, "held": True, "slope": 1.0, "slope_low": 0.0,
                             "slope_high": 2.0, "statement": "s"}]}  # fmt: skip
    h4 = {"hypotheses": [{"id": "H4", "p_one_sided": 0.02, "held": True, "decision": "holm", "dial": "regime",
                          "slope": 1.0, "slope_low": 0.0, "slope_high": 2.0, "statement": "s"}]}  # fmt: skip
    found = all_hypotheses({"shared_attributes": sweep}, {"h4": h4, "power": {"by_size": {}}})
    assert [h["id"] for h in found] == ["H1", "H4"]
    # Holm over two: 0.01 · 2 = 0.02, then max(0.02, 0.02 · 1) = 0.02: H4's adjusted p 0.02 < 0.05 holds;
    assert found[1]["p_holm"] == pytest.approx(0.02) and found[1]["held"]
    h4["hypotheses"][0]["p_one_sided"] = 0.03
    sweep["hypotheses"][0]["p_one_sided"] = 0.04
    found = all_hypotheses({"shared_attributes": sweep}, {"h4": h4})
    # 0.03 · 2 = 0.06 ≥ 0.05: H4 (Holm rule) no longer holds; H1 keeps its own rule (p 0.04 < 0.05: held as recorded)
    assert not found[1]["held"] and found[0]["held"]


def test_h4_is_a_one_sided_paired_test_of_the_two_regimes_gains() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from regime_hypothesis import decide

    def bench(gare: list[float], control: list[float]) -> dict:
        runs = [{"method": m, "seed": k, "test": {"t2v": {"R1": v}}} for m, vs in (("gare", gare),
                ("gare-control", control)) for k, v in enumerate(vs)]  # fmt: skip
        return {"name": "b", "runs": runs, "data_digest": "d", "results_sha256": "x",
                "config": {"run": {"model": {"two_tower": {"projection": "p"}}}}}  # fmt: skip

    clip = bench([20.0, 22.0, 25.0, 21.0], [19.0, 20.0, 22.0, 21.0])  # gains 1, 2, 3, 0
    linear = bench([10.0, 11.0, 12.0, 9.0], [20.0, 19.0, 22.0, 21.0])  # gains −10, −8, −10, −12
    record = decide(clip, linear, "gare", "gare-control", "t2v/R1")
    shifts = [11.0, 10.0, 13.0, 12.0]
    (h,) = record["hypotheses"]
    assert record["seeds"] == [0, 1, 2, 3] and h["slope"] == pytest.approx(11.5)
    assert h["p_one_sided"] == pytest.approx(t_test_p(shifts, "greater")) and h["decision"] == "holm"
    with pytest.raises(SystemExit, match="different data"):
        decide(clip, {**linear, "data_digest": "e"}, "gare", "gare-control", "t2v/R1")
