"""A run's resolved description: what a loaded config leaves to its backbone and head, decided once at the job's
start and handed to the layers below as values.

:func:`resolve_run` is the one function that turns a loaded :class:`~tvr.config.Config` into a :class:`RunSpec`:
the head's options checked and typed, the backbone's and the dataset format's settings typed, the frame size,
sampling and pixel normalisation the config leaves unset taken from the backbone, and what the data pipeline needs
of the backbone (its tokenizer, what its frozen features are a function of) answered from the backbone's folder. It
works on a copy, so the config it was given is not changed, and resolving a resolved config gives the same
description again.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from tvr.config import Config, ConfigError
from tvr.data.annotations import evaluation_splits
from tvr.data.feature_cache import FeatureIdentity
from tvr.data.formats.registry import available_dataset_formats, dataset_format_class, typed_data_config
from tvr.data.tokenizer import TokenizerSpec
from tvr.models.backbones.registry import (
    Backbone,
    Preprocess,
    backbone_spec,
    data_preprocess,
    typed_model_config,
    with_backbone_pixels,
)
from tvr.models.heads.base import RetrievalHead
from tvr.models.heads.registry import head_class, typed_head_config

__all__ = ["RunSpec", "resolve_run"]


@dataclass(frozen=True)
class RunSpec:
    """What a run is, resolved: ``config`` (its resolved config, as a run folder and a checkpoint record it; not to
    be changed), ``backbone`` and ``head`` (what ``model.backbone`` and ``head.name`` name), ``preprocess`` (the
    frames the data pipeline makes), ``tokenizer`` (the captions' tokenizer the backbone names) and ``features``
    (what the backbone's frozen features are a function of, which keys a feature cache)."""

    config: Config
    backbone: Backbone
    head: type[RetrievalHead]
    preprocess: Preprocess
    tokenizer: TokenizerSpec
    features: FeatureIdentity


def check_dataset_name(name: str) -> None:
    """``data.dataset`` names a registered dataset format (or, with trusted code, one by import path); ConfigError
    listing the known ones otherwise."""
    if dataset_format_class(name) is None:
        known = available_dataset_formats()
        raise ConfigError(f"data.dataset = {name!r}: expected one of {known} (or 'package.module:Class')")


def resolve_run(cfg: Config) -> RunSpec:
    """The run ``cfg`` describes, resolved (``cfg`` itself is left as it is). Raises ConfigError naming the field
    when the dataset format, the head's options or the backbone's settings do not fit them (in that order)."""
    own = copy.deepcopy(cfg)  # the description shares nothing with the caller's config
    check_dataset_name(own.data.dataset)
    if own.eval.split not in evaluation_splits():
        raise ConfigError(f"eval.split = {own.eval.split!r}: expected one of {list(evaluation_splits())}")
    head = typed_head_config(own.head)  # before the backbone: a bad head option is the error named
    model = typed_model_config(own.model)
    backbone = backbone_spec(model.backbone)
    data = with_backbone_pixels(typed_data_config(own.data), backbone, model)
    config = dataclasses.replace(own, head=head, model=model, data=data)
    return RunSpec(
        config=config,
        backbone=backbone,
        head=head_class(head.name),
        preprocess=data_preprocess(data),
        tokenizer=backbone.tokenizer(model),
        features=backbone.feature_identity(config),
    )
