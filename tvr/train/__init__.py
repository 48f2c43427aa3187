"""Training engine: optimizer/schedule (spec §1.4), distributed helpers, checkpoints and the resumable loop."""

from tvr.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tvr.train.data import DatasetTrainData, TrainData
from tvr.train.distributed import DistInfo, init_distributed, wrap_model
from tvr.train.optim import build_optimizer
from tvr.train.preemption import PREEMPTED_EXIT_CODE, PreemptedError
from tvr.train.schedule import build_scheduler, constant, warmup_cosine
from tvr.train.trainer import Trainer
from tvr.train.utils import seed_everything
from tvr.utils.distributed import gather_features, is_main_process

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "CheckpointError",
    "DatasetTrainData",
    "DistInfo",
    "TrainData",
    "Trainer",
    "PreemptedError",
    "build_optimizer",
    "build_scheduler",
    "constant",
    "gather_features",
    "init_distributed",
    "is_main_process",
    "load_checkpoint",
    "save_checkpoint",
    "seed_everything",
    "warmup_cosine",
    "wrap_model",
]
