"""The one walk that turns nested results into plain JSON, and the leaf rule of each writer that uses it."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from tvr.eval.report import _jsonable as metrics_jsonable
from tvr.search.server import jsonable as api_jsonable
from tvr.train.utils import to_jsonable
from tvr.utils.json_values import plain_json


def test_walk_rebuilds_containers_and_hands_every_other_value_to_the_leaf_rule() -> None:
    seen = []
    out = plain_json({1: (2, [3, {"x": None}]), "y": OrderedDict(z="w")}, lambda v: seen.append(v) or f"<{v}>")
    assert out == {"1": ["<2>", ["<3>", {"x": "<None>"}]], "y": {"z": "<w>"}}
    assert type(out["y"]) is dict and type(out["1"]) is list
    assert seen == [2, 3, None, "w"]


def test_training_values_become_numbers_and_lists() -> None:
    out = to_jsonable(
        {"loss": torch.tensor(0.5), "vec": torch.tensor([1.0, 2.0]), "n": np.int64(3), "arr": np.arange(2), "x": "s"}
    )
    assert out == {"loss": 0.5, "vec": [1.0, 2.0], "n": 3, "arr": [0, 1], "x": "s"}
    assert type(out["n"]) is int
    assert to_jsonable([math.inf, -math.inf, 1.5]) == ["inf", "-inf", 1.5]
    assert math.isnan(to_jsonable(np.float64("nan")))  # a numpy scalar is read as its number, as before


def test_metrics_values_are_numbers_or_paths_and_anything_else_is_refused() -> None:
    assert metrics_jsonable({"R@1": np.float32(0.25), "run": Path("a/b"), "k": (1, 5)}) == {
        "R@1": 0.25,
        "run": "a/b",
        "k": [1, 5],
    }
    with pytest.raises(TypeError, match="cannot write object value"):
        metrics_jsonable({"bad": object()})


def test_api_errors_state_exceptions_as_text() -> None:
    assert api_jsonable([{"ctx": {"error": ValueError("no")}, "loc": ("body", 0)}]) == [
        {"ctx": {"error": "no"}, "loc": ["body", 0]}
    ]
