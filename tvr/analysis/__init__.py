"""The papers' measurements and the training curves as figures: every figure a PNG plus the numbers behind it.

* :func:`plot_runs` (``tvr plot``): training curves of run folders (:mod:`.curves`).
* :func:`analyze_encoded` (``tvr analyze``, through ``tvr.pipeline.analyze``): a checkpoint's analyses on an
  encoded split (:mod:`.checkpoint`): the figures every head gets (:mod:`.similarity`), then the method's own, from
  the module its head names (``RetrievalHead.analysis_figures``; the built-in methods' are
  ``tvr/methods/<method>/figures``), called with a :class:`FigureContext`. :mod:`.gradients` (per-pair
  gradients), :mod:`.pairs`, :mod:`.summaries` and :mod:`.figures` are the helpers those modules share.

See docs/analysis.md for every figure with a reading.
"""

from tvr.analysis.checkpoint import MANIFEST, AnalysisOptions, analyze_encoded, method_figures
from tvr.analysis.context import FigureContext
from tvr.analysis.curves import RunFolderError, load_runs, plot_runs
from tvr.analysis.figures import DPI, FigureFiles, split_label, write_figure
from tvr.analysis.gradients import PairGradients, pair_gradients
from tvr.analysis.similarity import protocol_ranks, rank_histogram, score_distributions

__all__ = [
    "DPI",
    "MANIFEST",
    "AnalysisOptions",
    "FigureContext",
    "FigureFiles",
    "PairGradients",
    "RunFolderError",
    "analyze_encoded",
    "load_runs",
    "method_figures",
    "pair_gradients",
    "plot_runs",
    "protocol_ranks",
    "rank_histogram",
    "score_distributions",
    "split_label",
    "write_figure",
]
