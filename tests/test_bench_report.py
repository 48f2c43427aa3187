"""docs/results.md is generated from committed JSON: filling its template again from benchmarks/results/ gives the
committed document exactly (so every number in it is recomputed), the template holds no number of its own, and a
placeholder that names nothing is a one-line error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tvr.eval.results_document import TemplateError, derived_values, fill_template, format_value, lookup, write_report
from tvr.pipeline.bench import sealed, summarize

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_JSON = RESULTS / "bench_default.json"
SWEEPS = sorted(RESULTS.glob("bench_sweep_*.json"))
TEMPLATE = REPO / "docs" / "results.template.md"
DOCUMENT = REPO / "docs" / "results.md"


def test_docs_results_md_is_recomputed_from_the_committed_json(tmp_path: Path) -> None:
    for path in (DEFAULT_JSON, *SWEEPS):  # what the document says it was generated from is committed
        record = json.loads(path.read_text())
        assert record["results_sha256"] == sealed(record)["results_sha256"], f"{path} was edited after it was written"
    out = tmp_path / "results.md"
    write_report(DEFAULT_JSON, TEMPLATE, out, SWEEPS, "figures/results")
    assert out.read_text() == DOCUMENT.read_text(), "docs/results.md differs from `tvr bench report` of the JSON"
    for figure in re.findall(r"\]\((figures/results/[^)]+\.png)\)", DOCUMENT.read_text()):
        assert (tmp_path / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (DOCUMENT.parent / figure).is_file(), f"{figure} is linked but not committed"
    assert len(SWEEPS) == 2


def test_the_template_holds_no_number_of_its_own() -> None:
    """Every measured or configured number of the document is a placeholder: outside placeholders, code and link
    targets the template has no decimal number and no percentage."""
    text = TEMPLATE.read_text()
    text = re.sub(r"\{\{[^{}]*\}\}", "", text)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    assert not re.findall(r"\d+\.\d+|\d+\s?%", text)


def _results() -> dict:
    metrics = ("R1", "R5", "R10", "MdR", "MnR")
    run = lambda value: {d: dict.fromkeys(metrics, value) for d in ("t2v", "v2t")}  # noqa: E731
    runs = {
        "base": [{"seed": k, "test": run(v)} for k, v in enumerate([10.0, 12.0, 14.0])],
        "new": [{"seed": k, "test": run(v)} for k, v in enumerate([13.0, 14.0, 18.0])],
    }
    summary, differences = summarize(runs, "base")
    return {
        "name": "t", "baseline": "base", "seeds": [0, 1, 2], "methods": [{"name": "base"}, {"name": "new"}],
        "config": {"synth": {"num_videos": 50}}, "summary": summary, "differences": differences,
        "composition": {"val": {"videos": 10}, "test": {"videos": 20}},
        "runs": [{**r, "method": m, "best_epoch": 1, "inference_setting": None} for m, rs in runs.items() for r in rs],
        "provenance": {"timings": {"this_session": {"wall_seconds": 600.0, "cpu_seconds": 960.0}}},
    }  # fmt: skip


def test_placeholders_are_values_tables_and_derived_counts(tmp_path: Path) -> None:
    results = _results()
    text = fill_template(
        "Δ {{default.differences.new.t2v.R1.mean|+.1f}} of {{derived.n_comparisons}}; p {{default.differences.new."
        "t2v.R1.p_holm|p}}; share {{default.composition.val.videos}}; {{derived.quiet_two_core_minutes|.0f}} min; "
        "{{derived.train_videos}} train\n{{table:default.mde}}",
        results, {}, tmp_path,
    )  # fmt: skip
    # differences 3, 2, 4: mean 3; 2 methods × 10 cells = 10 comparisons; CPU 960 s over two cores = 8 min
    assert text.startswith("Δ +3.0 of 10; p ") and "share 10; 8 min; 20 train\n| method − base |" in text
    assert derived_values(results)["n_significant_holm"] == 0  # p = 0.035 for each of 10 cells: Holm 0.35
    assert format_value(0.7, "%0", "x") == "70 %" and format_value(0.0004, "p", "x") == "<0.001"
    assert lookup({"a": [{"b": 1}]}, "a.0.b") == 1


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{default.differences.nope.t2v}}", r"\{\{default.differences.nope.t2v\}\}: no 'nope' there"),
        ("{{table:default.nothing}}", r"no such table or figure"),
        ("{{default.name|.2f}}", r"format '.2f' does not apply to 't'"),
    ],
)
def test_a_placeholder_that_names_nothing_is_an_error(tmp_path: Path, template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        fill_template(template, _results(), {}, tmp_path)
