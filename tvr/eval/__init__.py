"""Evaluation: retrieval metrics, the dataset protocols (1:1, paragraph, multi-caption), DSL and reports."""

from tvr.eval.metrics import METRIC_KEYS, TIE_MODES, chance_metrics, gt_ranks, retrieval_metrics
from tvr.eval.postprocess import dual_softmax, dynamic_inverted_softmax, inverted_softmax, qb_norm, querybank_statistics
from tvr.eval.protocol import DATASET_PROTOCOLS, PROTOCOLS, default_protocol, evaluate, group_max
from tvr.eval.report import metrics_notes, metrics_table, write_metrics

__all__ = [
    "DATASET_PROTOCOLS",
    "METRIC_KEYS",
    "PROTOCOLS",
    "TIE_MODES",
    "chance_metrics",
    "default_protocol",
    "dual_softmax",
    "dynamic_inverted_softmax",
    "evaluate",
    "group_max",
    "gt_ranks",
    "inverted_softmax",
    "metrics_notes",
    "metrics_table",
    "qb_norm",
    "querybank_statistics",
    "retrieval_metrics",
    "write_metrics",
]
