"""The papers' measurements and the training curves as figures: every figure a PNG plus the numbers behind it.

* :func:`plot_runs` (``tvr plot``): training curves of run folders (:mod:`.curves`).
* :func:`analyze_encoded` (``tvr analyze``, through ``tvr.pipeline.analyze``): a checkpoint's analyses on an
  encoded split (:mod:`.checkpoint`), built from the functions of :mod:`.similarity`, :mod:`.gradients`,
  :mod:`.gare_gradients`, :mod:`.gare_geometry`, :mod:`.proxy` and :mod:`.gravialign`, each usable on its own.

See docs/analysis.md for every figure with a reading.
"""

from tvr.analysis.checkpoint import MANIFEST, AnalysisOptions, analyze_encoded
from tvr.analysis.curves import RunFolderError, load_runs, plot_runs
from tvr.analysis.figures import DPI, FigureFiles, split_label, write_figure
from tvr.analysis.gare_geometry import delta_geometry, gare_scores_without_delta, hard_negative_alignment
from tvr.analysis.gare_gradients import gare_batch_gradients, gare_gradient_tension
from tvr.analysis.gradients import PairGradients, pair_gradients
from tvr.analysis.gravialign import mode_comparison, sgi_term_distributions, uncertainty_vs_ambiguity
from tvr.analysis.proxy import embed_2d, gamma_sweep, proxy_queries, proxy_query_correlation
from tvr.analysis.similarity import protocol_ranks, rank_histogram, score_distributions

__all__ = [
    "DPI",
    "MANIFEST",
    "AnalysisOptions",
    "FigureFiles",
    "PairGradients",
    "RunFolderError",
    "analyze_encoded",
    "delta_geometry",
    "embed_2d",
    "gamma_sweep",
    "gare_batch_gradients",
    "gare_gradient_tension",
    "gare_scores_without_delta",
    "hard_negative_alignment",
    "load_runs",
    "mode_comparison",
    "pair_gradients",
    "plot_runs",
    "protocol_ranks",
    "proxy_queries",
    "proxy_query_correlation",
    "rank_histogram",
    "score_distributions",
    "sgi_term_distributions",
    "split_label",
    "uncertainty_vs_ambiguity",
    "write_figure",
]
