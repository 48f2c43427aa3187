"""A bench's ``results.json`` and a sweep's ``sweep.json`` read back: sealed by a digest when written, and checked
when read, so a report publishes only what ``tvr bench`` measured.

``tvr bench`` seals each record with ``results_sha256``, the SHA-256 of the record without its ``provenance`` (the
command, machine and timings; top level and per run), so it is equal for every run of the same config
(:func:`results_digest`). :func:`read_bench_record` reads one back for ``tvr bench report``: through the bounded
JSON reader (:mod:`tvr.utils.data_files`), refused unless its ``results_sha256`` is the digest of what it holds (a
number edited after the bench wrote it would otherwise be published as measured), then checked against the shape
the report reads (pydantic, strict: a number is a number, not a string that looks like one; the methods of the
runs, differences and baseline are those of the summary; a sweep's curves have a gain per point; a dial is a plain
name, since it names a figure's file), each problem one line naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tvr.bench.report import SWEEP_COLUMNS
from tvr.utils.data_files import read_json
from tvr.utils.errors import UserError
from tvr.utils.io import UnsafeNameError, safe_name

#: the largest results.json / sweep.json read (the committed default bench's is 1.5 MB)
MAX_RECORD_BYTES = 256 << 20


class BenchRecordError(UserError, ValueError):
    """A results.json / sweep.json that is not a record ``tvr bench`` wrote, or was changed after it was written."""


def results_digest(results: dict[str, Any]) -> str:
    """SHA-256 of a results record without its ``provenance`` (top level and per run): equal for every run of the
    same config, however often it was interrupted and wherever its folder lies."""
    view = {k: v for k, v in results.items() if k not in ("provenance", "results_sha256")}
    if "runs" in view:
        view["runs"] = [{k: v for k, v in run.items() if k != "provenance"} for run in view["runs"]]
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()


def sealed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as plain JSON types (what the file will hold) with its ``results_sha256``."""
    record = json.loads(json.dumps(record))
    record["results_sha256"] = results_digest(record)
    return record


# ------------------------------------------------------------------------------------- the shape the report reads

Cell = TypeVar("Cell")


class _Part(BaseModel):
    """Strict types (no string read as a number), other fields ignored: a record carries more than a report reads."""

    model_config = ConfigDict(strict=True, extra="ignore")


class Interval(_Part):
    mean: float
    half_width: float
    low: float
    high: float


class Difference(_Part):
    mean: float
    low: float
    high: float
    p: float
    p_holm: float
    mde: float


RECALLS = ("R1", "R5", "R10")


class ByMetric(_Part, Generic[Cell]):
    R1: Cell
    R5: Cell
    R10: Cell
    MdR: Cell
    MnR: Cell

    @model_validator(mode="after")
    def _possible(self) -> ByMetric[Cell]:
        """A forged record can carry a matching digest (the seal has no secret): numbers no retrieval can produce —
        a recall outside 0-100, a rank below 1, a difference wider than the scale, NaN or infinity — are refused."""
        for name in (*RECALLS, "MdR", "MnR"):
            cell = getattr(self, name)
            if not isinstance(cell, Interval | Difference):
                continue
            mean = cell.mean
            if not math.isfinite(mean):
                raise ValueError(f"{name}: mean {mean} is not a finite number")
            if isinstance(cell, Interval) and name in RECALLS and not 0 <= mean <= 100:
                raise ValueError(f"{name}: mean {mean} is not a recall (a percentage, 0 to 100)")
            if isinstance(cell, Interval) and name not in RECALLS and mean < 1:
                raise ValueError(f"{name}: mean {mean} is not a rank (1 or more)")
            if isinstance(cell, Difference) and name in RECALLS and abs(mean) > 100:
                raise ValueError(f"{name}: difference {mean} is wider than a recall's scale (-100 to 100)")
        return self


class ByDirection(_Part, Generic[Cell]):
    t2v: ByMetric[Cell]
    v2t: ByMetric[Cell]


class Recall(_Part):
    R1: float = Field(ge=0, le=100)


class CurvePoint(_Part):
    epoch: int
    t2v: Recall
    v2t: Recall


class Run(_Part):
    method: str
    seed: int
    best_epoch: int
    inference_setting: dict[str, Any] | None = None
    val_curve: list[CurvePoint]
    test: dict[str, Recall]

    @field_validator("test")
    @classmethod
    def _both_directions(cls, test: dict[str, Recall]) -> dict[str, Recall]:
        missing = [d for d in ("t2v", "v2t") if d not in test]
        if missing:
            raise ValueError(f"no {' or '.join(missing)} metrics")
        return test


class SplitShares(_Part):
    videos: int
    queries: int
    full_caption_share: float
    twin_share: float
    false_negative_share: float
    twins_in_other_splits: int


class Composition(_Part):
    val: SplitShares
    test: SplitShares
    tolerance: float
    differs: list[str]


class Empty(BaseModel):
    """``{}``: what a record holds where there is nothing (no composition for an annotation folder)."""

    model_config = ConfigDict(strict=True, extra="forbid")


class Transfer(_Part):
    skipped: str | None = None
    split: str | None = None
    data: dict[str, Any] | None = None
    summary: dict[str, ByDirection[Interval]] | None = None

    @model_validator(mode="after")
    def _skipped_or_measured(self) -> Transfer:
        if self.skipped is None and (self.split is None or self.data is None or self.summary is None):
            raise ValueError("neither skipped (with its reason) nor measured (split, data and summary)")
        return self


class Session(_Part):
    wall_seconds: float = math.nan
    cpu_seconds: float = math.nan


class Timings(_Part):
    this_session: Session = Session()


class Provenance(_Part):
    command: str = ""
    timings: Timings = Timings()


class BenchConfigPart(_Part):
    synth: dict[str, Any] | None = None


def _consistent_methods(summary: dict[str, Any], baseline: str, others: dict[str, list[str]]) -> None:
    if baseline not in summary:
        raise ValueError(f"the baseline {baseline!r} has no summary")
    for where, names in others.items():
        unknown = sorted(set(names) - set(summary))
        if unknown:
            raise ValueError(f"{where} name methods the summary does not have: {unknown[:5]}")


class Results(_Part):
    """What ``tvr bench report`` reads of a ``results.json``."""

    name: str
    description: str = ""
    seeds: list[int] = Field(min_length=1)
    epochs: int
    baseline: str
    selection: str
    methods: list[dict[str, Any]]
    runs: list[Run]
    summary: dict[str, ByDirection[Interval]] = Field(min_length=1)
    differences: dict[str, ByDirection[Difference]]
    composition: Composition | Empty = Empty()
    transfer: dict[str, Transfer] = {}
    config: BenchConfigPart
    dials: dict[str, Any] = {}
    provenance: Provenance = Provenance()

    @model_validator(mode="after")
    def _same_methods(self) -> Results:
        _consistent_methods(
            self.summary, self.baseline, {"runs": [r.method for r in self.runs], "differences": list(self.differences)}
        )
        return self


class Trend(_Part):
    mean: float
    low: float
    high: float
    p_greater: float


class Gain(_Part):
    mean: float
    low: float
    high: float
    p_holm: float = math.nan


class Curve(_Part):
    values: list[float]
    gain: list[Gain]
    trend: Trend


class PointShares(_Part):
    twin_share: float
    false_negative_share: float


class PointComposition(_Part):
    test: PointShares | None = None


class Point(_Part):
    value: float = Field(allow_inf_nan=False)
    composition: PointComposition | Empty | None = None


class Hypothesis(_Part):
    id: str
    method: str
    metric: str
    expect: str
    statement: str
    slope: float
    slope_low: float
    slope_high: float
    p_one_sided: float
    held: bool


class Sweep(_Part):
    """What ``tvr bench report`` reads of a ``sweep.json``."""

    name: str
    description: str = ""
    dial: str
    dial_meaning: str = ""
    values: list[float] = Field(min_length=2)
    baseline: str
    seeds: list[int] = Field(min_length=1)
    epochs: int
    points: list[Point]
    curves: dict[str, dict[str, Curve]]
    hypotheses: list[Hypothesis]
    provenance: Provenance = Provenance()

    @field_validator("dial")
    @classmethod
    def _plain_dial(cls, dial: str) -> str:
        try:
            return safe_name(dial, "value")  # it names the sweep's figure file
        except UnsafeNameError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _a_gain_per_point(self) -> Sweep:
        if len(self.points) != len(self.values):
            raise ValueError(f"{len(self.points)} points for {len(self.values)} values")
        for method, curves in self.curves.items():
            missing = [key for key in SWEEP_COLUMNS if key not in curves]
            if missing:
                raise ValueError(f"curves.{method}: no {missing[0]} curve")
            for key, curve in curves.items():
                if not len(curve.values) == len(curve.gain) == len(self.points):
                    raise ValueError(
                        f"curves.{method}.{key}: {len(curve.values)} values and {len(curve.gain)} gains for "
                        f"{len(self.points)} points"
                    )
        return self


def _field(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the dotted path a template uses (``summary.gare.t2v.R1.mean``), without the
    names pydantic adds for the members of a union (``Composition``, ``dict[str,any]``, ``none``)."""
    union_members = {cls.__name__ for cls in (*_Part.__subclasses__(), Empty)}
    return ".".join(str(p) for p in loc if not (p in union_members or "[" in str(p) or p == "none"))


def _problem(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    message = str(first["msg"]).removeprefix("Value error, ").replace("Input should be ", "expected ")
    message = re.sub(r"a valid dictionary or instance of \S+", "an object", message)
    message = message.replace("Field required", "missing")
    field = _field(first["loc"])
    more = exc.error_count() - 1
    return (f"{field}: " if field else "") + message + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def read_bench_record(path: str | Path, kind: str) -> dict[str, Any]:
    """The results record at ``path`` (``kind``: ``"results"`` for a bench's results.json, ``"sweep"`` for a
    sweep.json), read and checked as the module docstring says; :class:`BenchRecordError` (one line) otherwise."""
    what = {"results": "bench results.json", "sweep": "sweep.json"}[kind]
    record = read_json(path, max_bytes=MAX_RECORD_BYTES)
    if not isinstance(record, dict) or not isinstance(record.get("results_sha256"), str):
        raise BenchRecordError(f"{path}: not a {what} written by tvr bench (no results_sha256)")
    if record["results_sha256"] != results_digest(record):
        raise BenchRecordError(
            f"{path}: its numbers do not match its results_sha256: the file was changed after tvr bench wrote it, "
            "and a report publishes only measured results (restore the file, or run the bench again)"
        )
    try:
        (Results if kind == "results" else Sweep).model_validate(record)
    except ValidationError as exc:
        raise BenchRecordError(f"{path}: {_problem(exc)}; not a {what} as tvr bench writes it") from None
    return record


__all__ = ["BenchRecordError", "read_bench_record", "results_digest", "sealed"]
