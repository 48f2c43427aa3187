"""End-to-end jobs behind the CLI: train (with validation-based selection and a single final test), eval, and the
feature cache (:mod:`tvr.pipeline.features`).

Every job first resolves its config (:func:`resolve_config`): the head's options are checked against the head's
own dataclass, so a bad value stops the job before a run folder is written or a step runs.
"""

from __future__ import annotations

from tvr.pipeline.features import build_feature_cache
from tvr.pipeline.jobs import (
    SplitEvaluator,
    load_model_for_eval,
    resolve_config,
    run_eval,
    run_train,
    torch_threads,
    write_eval,
)
from tvr.pipeline.preflight import PreflightError
from tvr.pipeline.run_folder import RESUME_AUTO, RunFolderError
from tvr.train.preemption import PREEMPTED_EXIT_CODE, PreemptedError

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "RESUME_AUTO",
    "PreflightError",
    "RunFolderError",
    "SplitEvaluator",
    "PreemptedError",
    "build_feature_cache",
    "load_model_for_eval",
    "resolve_config",
    "run_eval",
    "run_train",
    "torch_threads",
    "write_eval",
]
