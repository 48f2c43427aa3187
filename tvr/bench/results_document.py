"""A results document written from committed bench results: prose from a template, every number from the JSON.

docs/results.md is the project's published answer to "does a method beat the baseline?". It must be recomputable:
``tvr bench report`` fills a markdown template whose numbers are all placeholders into the committed
``results.json`` of a bench and the ``sweep.json`` of its dial sweeps, and ``tests/test_bench_report.py`` fills it
again and compares. The template is data, never code: a placeholder is a dotted path into the records, with an
optional format, or the name of a table or figure this module renders.

* ``{{default.differences.gare.t2v.R1.mean|+.1f}}``: a value (``default``: the bench; ``sweeps.<dial>``: a sweep;
  ``hypotheses``: every sweep's pre-registered hypotheses with Holm-adjusted p-values across all of them;
  ``derived``: counts and sums of the bench, :func:`derived_values`). A list
  item is addressed by its index. Formats: Python's format specification, ``p`` (a p-value as the tables print
  it) or ``%N`` (a share as a percentage with N decimals: ``0.7`` → ``70 %``).
* ``{{table:default.differences}}`` (also ``results``, ``holm``, ``mde``, ``composition``, ``selection``,
  ``transfer``), ``{{table:sweep.<dial>.<method>}}``, ``{{table:sweep.<dial>.hypotheses}}``, ``{{table:hypotheses}}``.
* ``{{figure:default.val}}``, ``{{figure:default.test}}``, ``{{figure:sweep.<dial>}}``: the figure is written into
  the figures folder and the placeholder becomes its path relative to the document.
* Further JSON records named on the command line (``--source power=benchmarks/results/bench_power.json``) are read
  by their name: ``{{power.by_size.1000.pooled_sd|.2f}}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tvr.bench import report
from tvr.bench.records import read_bench_record
from tvr.utils.data_files import DataFileError, read_data_bytes, read_json
from tvr.utils.errors import UserError, reason
from tvr.utils.io import atomic_write_text, inside

PLACEHOLDER = re.compile(r"\{\{\s*([^{}|]+?)\s*(?:\|\s*([^{}]*?)\s*)?\}\}")
#: Python's format specification: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
FORMAT_SPEC = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d+))?[bcdeEfFgGnosxX%]?", re.S
)
#: the widest field and the most decimals a placeholder may ask for (a width of 2e9 allocated 2 GB)
MAX_WIDTH = 100
MAX_PRECISION = 20
#: the largest template read
MAX_TEMPLATE_BYTES = 4 << 20


class TemplateError(UserError):
    """A placeholder of a results template names nothing in the records, or a format that does not apply."""


def lookup(sources: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of nested mappings and lists (list items by index)."""
    node: Any = sources
    for segment in path.split("."):
        if isinstance(node, dict) and segment in node:
            node = node[segment]
        elif isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
            node = node[int(segment)]
        else:
            raise TemplateError(f"{{{{{path}}}}}: no {segment!r} there")
    return node


def _bounded_spec(spec: str, where: str) -> str:
    """``spec`` when it is a format specification asking for at most :data:`MAX_WIDTH` characters and
    :data:`MAX_PRECISION` decimals; :class:`TemplateError` otherwise."""
    shown = spec if len(spec) <= 40 else spec[:37] + "..."
    if spec.startswith("%"):
        if not spec[1:].isdigit() and spec != "%":
            raise TemplateError(f"{where}: format {shown!r}: expected %N, N the decimals of a percentage")
        precision = int(spec[1:] or 0)
        width = 0
    else:
        match = FORMAT_SPEC.fullmatch(spec)
        if match is None:
            raise TemplateError(f"{where}: format {shown!r} is not a Python format specification")
        width, precision = int(match["width"] or 0), int(match["precision"] or 0)
    if width > MAX_WIDTH:
        raise TemplateError(f"{where}: format {shown!r} asks for {width:,} characters; at most {MAX_WIDTH}")
    if precision > MAX_PRECISION:
        raise TemplateError(f"{where}: format {shown!r} asks for {precision:,} decimals; at most {MAX_PRECISION}")
    return spec


def format_value(value: Any, spec: str, where: str) -> str:
    """``value`` by ``spec``: ``p``, ``%N`` or a Python format specification (width and decimals bounded)."""
    if spec != "p":
        _bounded_spec(spec, where)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    try:
        if spec == "p":
            return report.p_text(float(value))
        if spec.startswith("%"):
            return f"{100.0 * float(value):.{int(spec[1:] or 0)}f} %"
        return format(value, spec)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TemplateError(f"{where}: format {spec!r} does not apply to {shown} ({exc})") from None


#: a pre-registered hypothesis decided on its Holm-adjusted p over the whole family (``"decision": "holm"``);
#: without it, on its own one-sided p (H1–H3's rule)
HOLM_DECISION = "holm"


def all_hypotheses(
    sweeps: dict[str, dict[str, Any]], extra: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every pre-registered hypothesis the records decide — the sweeps' (in dial order) and those of any further
    record with a ``hypotheses`` list (a regime comparison, an old regime's sweep) — sorted by id, each with
    ``p_holm``: Holm-adjusted over all of them, and ``held`` by its own rule (``decision: holm``: its adjusted p;
    else its one-sided p, below :data:`tvr.bench.report.ALPHA`)."""
    from tvr.bench.stats import holm

    found = [{**h, "dial": h.get("dial", dial)} for dial in sorted(sweeps) for h in sweeps[dial]["hypotheses"]]
    for record in (extra or {}).values():
        if isinstance(record, dict) and isinstance(record.get("hypotheses"), list):
            found += [{**h, "dial": h.get("dial", record.get("dial", ""))} for h in record["hypotheses"]
                      if "p_one_sided" in h]  # fmt: skip
    found.sort(key=lambda h: (len(str(h["id"])), str(h["id"])))
    for h, adjusted in zip(found, holm([h["p_one_sided"] for h in found]), strict=True):
        h["p_holm"] = adjusted
        if h.get("decision") == HOLM_DECISION:
            h["held"] = bool(adjusted < report.ALPHA)
    return found


def derived_values(results: dict[str, Any]) -> dict[str, Any]:
    """Counts and sums the prose of a results document quotes that no single JSON field holds."""
    cells = [c for diff in results["differences"].values() for d in diff.values() for c in d.values()]
    control_cells = [c for entry in (results.get("controls") or {}).values() for d in entry["differences"].values()
                     for c in d.values()]  # fmt: skip
    timings = results.get("provenance", {}).get("timings", {})
    session = timings.get("this_session", {})
    composition = results.get("composition") or {}
    synth = results["config"].get("synth") or {}
    r1 = [diff["t2v"]["R1"]["mde"] for diff in results["differences"].values()]
    return {
        "n_seeds": len(results["seeds"]),
        "n_methods": len(results["methods"]),
        "n_runs": len(results["runs"]),
        "n_comparisons": len(cells),
        "n_significant_holm": sum(report.significant(c) for c in cells),
        "n_significant_raw": sum(c["p"] < report.ALPHA for c in cells),
        # the own-control comparisons, and the whole table (baseline and control comparisons, one Holm family)
        "n_control_comparisons": len(control_cells),
        "n_control_significant_holm": sum(report.significant(c) for c in control_cells),
        "n_comparisons_all": len(cells) + len(control_cells),
        "n_significant_holm_all": sum(report.significant(c) for c in cells + control_cells),
        "max_mde_t2v_r1": max(r1, default=math.nan),
        "min_mde_t2v_r1": min(r1, default=math.nan),
        "n_photos": len((results.get("dials") or {}).get("photos", {})),
        "train_videos": synth.get("num_videos", 0)
        - sum(composition.get(split, {}).get("videos", 0) for split in ("val", "test")),
        "wall_minutes": session.get("wall_seconds", math.nan) / 60.0,
        "cpu_minutes": session.get("cpu_seconds", math.nan) / 60.0,
        # judged as the bench's CPU time spread over two cores: what a quiet 2-core machine would take
        "quiet_two_core_minutes": session.get("cpu_seconds", math.nan) / 120.0,
    }


def selection_table(results: dict[str, Any]) -> str:
    """What validation chose per method and seed, and the test t2v R@1 it led to (and at the head's baseline
    setting, where it has one)."""
    lines = [
        "| method | best epoch per seed | inference setting per seed | test t2v R@1 per seed | at the head's baseline "
        "setting |",
        "|---|---|---|---|---|",
    ]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_method.setdefault(run["method"], []).append(run)
    for method, runs in by_method.items():
        epochs = ", ".join(str(r["best_epoch"]) for r in runs)
        settings = ", ".join(
            report.setting_text(r["inference_setting"]) if r["inference_setting"] else "–" for r in runs
        )
        recall = ", ".join(f"{r['test']['t2v']['R1']:g}" for r in runs)
        baselines = sorted({k.removeprefix("t2v@") for r in runs for k in r["test"] if k.startswith("t2v@")})
        at_baseline = "; ".join(
            f"{name}: " + ", ".join(f"{r['test'][f't2v@{name}']['R1']:g}" for r in runs) for name in baselines
        )
        lines.append(f"| {method} | {epochs} | {settings} | {recall} | {at_baseline or '–'} |")
    return "\n".join(lines)


def all_hypotheses_table(hypotheses: list[dict[str, Any]]) -> str:
    if not hypotheses:
        return "(no pre-registered hypotheses)"
    lines = [
        "| id | dial | hypothesis | slope [95 % CI] | one-sided p | Holm-adjusted over all | held (p < 0.05)? |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for h in hypotheses:
        slope = f"{h['slope']:+.1f} [{h['slope_low']:+.1f}, {h['slope_high']:+.1f}]"
        rule = " (Holm-adjusted p)" if h.get("decision") == HOLM_DECISION else ""
        lines.append(f"| {h['id']} | {h['dial']} | {h['statement']} | {slope} | {report.p_text(h['p_one_sided'])} | "
                     f"{report.p_text(h['p_holm'])} | {'**yes**' if h['held'] else 'no'}{rule} |")  # fmt: skip
    return "\n".join(lines)


def _is_bench(record: Any) -> bool:
    return isinstance(record, dict) and all(k in record for k in ("runs", "summary", "differences", "seeds"))


def _is_sweep(record: Any) -> bool:
    return isinstance(record, dict) and all(k in record for k in ("curves", "points", "dial"))


def _renderers(
    results: dict[str, Any], sweeps: dict[str, dict[str, Any]], hypotheses: list[dict[str, Any]], figures: Path,
    link: str, extra: dict[str, Any] | None = None,
) -> dict[str, Callable[[], str]]:  # fmt: skip
    def figure(name: str, draw: Callable[[Path], Any]) -> Callable[[], str]:
        def render() -> str:
            draw(inside(figures, name, "a figure's file name"))  # a sweep's dial names its figure
            return f"{link}/{name}" if link else name

        return render

    def bench_tables(name: str, record: dict[str, Any], prefix: str) -> dict[str, Callable[[], str]]:
        """The tables and figures of one bench record, as ``table:<name>.<table>`` / ``figure:<name>.<figure>``."""
        return {
            f"table:{name}.results": lambda: report.results_table(record),
            f"table:{name}.differences": lambda: report.differences_table(record),
            f"table:{name}.holm": lambda: report.holm_table(record),
            f"table:{name}.mde": lambda: report.mde_table(record),
            f"table:{name}.controls": lambda: report.control_differences_table(record),
            f"table:{name}.controls_holm": lambda: report.control_holm_table(record),
            f"table:{name}.controls_mde": lambda: report.control_mde_table(record),
            f"table:{name}.composition": lambda: "\n".join(report.composition_lines(record)).strip(),
            f"table:{name}.selection": lambda: selection_table(record),
            f"table:{name}.direction_selection": lambda: report.direction_selection_table(record),
            f"table:{name}.norms": lambda: report.norms_table(record),
            f"table:{name}.transfer": lambda: "\n".join(report.transfer_lines(record)).strip(),
            f"figure:{name}.val": figure(f"{prefix}val_r1.png", lambda p: report.plot_validation_curves(record, p)),
            f"figure:{name}.test": figure(f"{prefix}test_r1.png", lambda p: report.plot_test_recall(record, p)),
        }

    def sweep_tables(name: str, record: dict[str, Any], figure_name: str) -> dict[str, Callable[[], str]]:
        tables: dict[str, Callable[[], str]] = {
            f"table:{name}.{method}": lambda m=method: report.sweep_table(record, m) for method in record["curves"]
        }
        tables[f"table:{name}.hypotheses"] = lambda: report.hypotheses_table(record["hypotheses"])
        tables[f"figure:{name}"] = figure(figure_name, lambda p: report.plot_sweep(record, p))
        return tables

    tables = {**bench_tables("default", results, ""), "table:hypotheses": lambda: all_hypotheses_table(hypotheses)}
    for dial, record in sweeps.items():
        tables.update(sweep_tables(f"sweep.{dial}", record, f"sweep_{dial}.png"))
    for name, record in (extra or {}).items():  # further bench or sweep records named on the command line
        if _is_bench(record):
            tables.update(bench_tables(name, record, f"{name}_"))
        elif _is_sweep(record):
            tables.update(sweep_tables(name, record, f"{name}.png"))
    return tables


def fill_template(
    template: str,
    results: dict[str, Any],
    sweeps: dict[str, dict[str, Any]],
    figures: Path,
    link: str = "",
    extra: dict[str, Any] | None = None,
) -> str:
    """``template`` with every placeholder replaced (module docstring); figures are written into ``figures`` and
    linked as ``link/<name>``; ``extra`` names further JSON records placeholders may read (``{{name.path}}``)."""
    hypotheses = all_hypotheses(sweeps, extra)
    sources = {"default": results, "sweeps": sweeps, "hypotheses": hypotheses, "derived": derived_values(results)}
    for name, record in (extra or {}).items():
        if name in sources:
            raise TemplateError(f"an extra source may not be named {name!r} (reserved: {sorted(sources)})")
        sources[name] = record
    renderers = _renderers(results, sweeps, hypotheses, figures, link, extra)
    for name, record in (extra or {}).items():
        if _is_bench(record):
            sources[f"{name}_derived"] = derived_values(record)

    def replace(match: re.Match) -> str:
        key, spec = match.group(1), match.group(2)
        if key.startswith(("table:", "figure:")):
            if key not in renderers:
                raise TemplateError(f"{{{{{key}}}}}: no such table or figure; there are {sorted(renderers)}")
            return renderers[key]()
        value = lookup(sources, key)
        if isinstance(value, float) and math.isnan(value):
            return "–"
        return format_value(value, spec or "", f"{{{{{key}}}}}")

    return PLACEHOLDER.sub(replace, template)


def write_report(
    results_path: Path,
    template_path: Path,
    out_path: Path,
    sweep_paths: list[Path],
    figures: str,
    extra_paths: dict[str, Path] | None = None,
) -> Path:
    """``tvr bench report``: fill ``template_path`` from a bench's results.json, its sweeps' sweep.json and any
    ``extra_paths`` (name → JSON file) into ``out_path``, the figures into ``figures`` (relative to ``out_path``'s
    folder)."""
    results = read_bench_record(results_path, "results")
    sweeps: dict[str, dict[str, Any]] = {}
    for path in sweep_paths:
        record = read_bench_record(path, "sweep")
        if record["dial"] in sweeps:
            raise UserError(f"{path}: a second sweep of {record['dial']}; give one sweep.json per dial")
        sweeps[record["dial"]] = record
    extra = {}
    for name, path in (extra_paths or {}).items():
        try:
            extra[name] = read_json(path)
        except (OSError, DataFileError) as exc:
            raise UserError(f"{path}: cannot read the JSON named {name!r} ({reason(exc)})") from None
    try:
        template = read_data_bytes(template_path, MAX_TEMPLATE_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{template_path}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected a markdown template"
        ) from None
    try:
        text = fill_template(template, results, sweeps, out_path.parent / figures, figures, extra)
    except TemplateError as exc:
        raise TemplateError(f"{template_path}: {exc}") from None
    return atomic_write_text(out_path, text)


__all__ = [
    "TemplateError",
    "derived_values",
    "fill_template",
    "format_value",
    "lookup",
    "selection_table",
    "write_report",
]
