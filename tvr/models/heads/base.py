"""The contract every method head implements.

A head sees backbone features only (``TextFeatures``/``VideoFeatures``), so the same head trains on raw videos
through CLIP and on cached frozen features. A head class declares

* ``Options``: a dataclass of its settings (``head.options`` in a config). Fields use ``tvr.config.choice`` /
  ``bounded`` for choices and ranges and may define ``validate()``; the registry checks them when a config loads.
* ``build()``: creates the head's modules from ``self.dim`` and ``self.options``. The base class owns the
  constructor ``__init__(dim, options, *, logit_scale_init, logit_scale_max)`` the registry calls: it validates the
  options (the same checks a config gets) before ``build`` runs, so no head repeats them.
* ``encode_texts`` / ``encode_videos``: per-item states, sliceable along dim 0 (see ``tvr.types.Sliceable``).
* ``score_block(text_state, video_state) -> [n_t, n_v]``: the exact score of every pair of a block.
* ``loss(TextFeatures, VideoFeatures, shard=None) -> {"loss": ..., components...}`` on B aligned pairs.
* ``indexable``: True when the score is a plain dot product of ``state.emb`` vectors, so a gallery can go into an
  ANN index and all-pairs scoring is one matrix product.
* ``analysis_figures`` (optional): the module of the method's own ``tvr analyze`` figures (``".figures"``: the
  head's folder's ``figures``), which the analysis layer imports; a head never imports plotting code.

Everything else is shared here: chunked all-pairs scoring (never an N_t × N_v × D tensor), exact scores of given
(text, video) pairs, and two-stage scoring (shortlist by a dot-product embedding, exact rerank) for any head. A
non-indexable head offers a cheap shortlist embedding (``shortlist_texts`` / ``shortlist_videos``) and may override
``score_pairs`` with a faster exact implementation.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tvr.config import check_field_values
from tvr.models.heads.common import check_pairs, rerank_to_dense, top_k_by_dot
from tvr.utils.distributed import RowShard

LN_100 = math.log(100.0)
#: texts per matrix product of an indexable head's all-pairs scoring (against every video at once)
INDEXABLE_TEXT_CHUNK = 1024
#: texts and videos per block of a pairwise head's all-pairs scoring, unless the head sets its own
PAIRWISE_CHUNK = 256


@dataclasses.dataclass
class NoOptions:
    """Options of a head that has none."""


@dataclasses.dataclass(frozen=True)
class ParamRule:
    """How the optimizer treats the parameters whose full model name starts with ``prefix`` (first match wins).

    ``lr``: absolute learning rate (None: the default, train.lr or train.lr × backbone_lr_coef for the backbone);
    ``schedule``: None follows ``train.schedule``, ``"constant"`` keeps the lr fixed (no warm-up, no decay);
    ``decay``: force weight decay on/off (None: the default name rule — no decay on biases, norms, embeddings);
    ``applies_to``: ``"all"``, or only the parameters the default rule puts in the ``"decay"`` / ``"nodecay"`` set;
    ``contains``: only parameters whose full name contains this substring (how released code often splits its
    groups, e.g. ``"bias"``). Parameters matched by a rule form the optimizer groups ``<group>`` and
    ``<group>-nodecay``."""

    prefix: str
    group: str
    lr: float | None = None
    schedule: str | None = None
    decay: bool | None = None
    applies_to: str = "all"
    contains: str | None = None

    def __post_init__(self) -> None:
        if self.applies_to not in ("all", "decay", "nodecay"):
            raise ValueError(f"ParamRule.applies_to = {self.applies_to!r}: expected all, decay or nodecay")


class RetrievalHead(nn.Module, ABC):
    """Base class of all method heads (see the module docstring for the contract)."""

    #: the registered name (set by ``register_head``; an import-path head keeps its class name)
    name: ClassVar[str] = ""
    #: the options dataclass ``head.options`` is validated against
    Options: ClassVar[type] = NoOptions
    #: True when ``score_block`` is ``text_state.emb @ video_state.emb.T`` (an instance may override it)
    indexable: ClassVar[bool] = False
    #: texts (and videos) per block of :meth:`score`; None takes the defaults below. An indexable head scores a
    #: chunk of INDEXABLE_TEXT_CHUNK texts against the whole gallery (one matrix product); a pairwise head scores
    #: blocks of at most PAIRWISE_CHUNK × PAIRWISE_CHUNK pairs, so a block's memory is bounded whatever the gallery
    default_text_chunk: ClassVar[int | None] = None
    default_video_chunk: ClassVar[int | None] = None
    #: texts per group in the generic :meth:`score_pairs` (each group scores the union of its videos as a grid)
    pair_text_group: ClassVar[int] = 64
    #: optional ``VideoFeatures``/``TextFeatures`` fields the head reads ("proxies", "words"); the model builder
    #: checks the backbone provides them (proxies: ``model.backbone: clipvip`` with ``clipvip.proxy_projection``)
    requires: ClassVar[frozenset[str]] = frozenset()
    #: ``head.options`` that ``tvr demo`` sets: the demo trains a tiny CLIP from scratch at lr 1e-3, far from the
    #: pretrained recipes a head's defaults are chosen for; a head whose defaults do not train there says so here
    demo_options: ClassVar[dict[str, Any]] = {}
    #: the module of the method's own ``tvr analyze`` figures, a ``write_figures(context)`` function
    #: (``tvr.analysis.context.FigureContext`` in, a list of ``FigureFiles`` out); a leading dot is relative to the head
    #: class's package (``".figures"``: ``tvr/methods/<method>/figures``). It is analysis code, so only the
    #: analysis layer imports it, never the head. None: the figures every head gets, nothing more
    analysis_figures: ClassVar[str | None] = None
    #: the module whose ``RELEASE_KEYS`` (a :class:`tvr.models.import_checkpoint.ReleaseKeys`) maps the head's part
    #: of its authors' released checkpoint onto ``head.*`` (``tvr import-checkpoint``); a leading dot is relative to
    #: the head class's package (GARE: ``".release_keys"``, its ψ). None: the method has no release of its own
    release_keys: ClassVar[str | None] = None

    def __init__(
        self,
        dim: int,
        options: Any = None,
        *,
        logit_scale_init: float = LN_100,
        logit_scale_max: float = LN_100,
    ) -> None:
        """The one constructor every head shares: checks ``dim``, builds or checks ``options`` against the head's
        ``Options`` dataclass (types, ``choice``/``bounded`` fields and its ``validate()``, one rule for every
        head), sets up CLIP's learnable temperature, then calls :meth:`build` for the head's own modules."""
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"{type(self).__name__}: dim must be a positive integer, got {dim!r}")
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise TypeError(
                f"{type(self).__name__}: options must be a {self.Options.__name__}, got {type(options).__name__}"
            )
        check_field_values(options, "head.options")
        self.dim = dim
        self.options = options
        # CLIP's learnable temperature, stored as a log; clamped after every optimizer step (spec §1.1)
        self.logit_scale = nn.Parameter(torch.tensor(float(logit_scale_init)))
        self.logit_scale_max = float(logit_scale_max)
        self.build()

    def build(self) -> None:
        """Create the head's modules and buffers from ``self.dim`` and the validated ``self.options`` (called once,
        at the end of the base constructor). A head with no parameters of its own leaves it empty."""

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        self.logit_scale.clamp_(max=self.logit_scale_max)

    # ------------------------------------------------------------------ what every head implements
    @abstractmethod
    def encode_texts(self, text: Any) -> Any:
        """Per-text state (sliceable along dim 0) that ``score_block`` consumes."""

    @abstractmethod
    def encode_videos(self, video: Any) -> Any:
        """Per-video state (sliceable along dim 0) that ``score_block`` consumes."""

    @abstractmethod
    def score_block(self, text_state: Any, video_state: Any) -> Tensor:
        """Similarity of every text in the block with every video in the block: [n_t, n_v]."""

    @abstractmethod
    def loss(self, text: Any, video: Any, shard: RowShard | None = None) -> dict[str, Tensor]:
        """Training loss for B aligned pairs (text i matches video i). Key ``"loss"`` is optimised;
        the other keys are detached components for logging.

        ``shard`` is this rank's :class:`~tvr.utils.distributed.RowShard` of the gathered batch under torchrun (None:
        one process, every row). A head may ignore it and compute the whole loss on every rank (the same gradient,
        without the speed-up); one that splits its pairwise work by rows computes it only for ``shard``'s texts."""

    def param_rules(self, lr: float, backbone_lr: float) -> list[ParamRule]:
        """Optimizer rules beyond the default backbone/head split (e.g. a module on its own peak lr); ``lr`` and
        ``backbone_lr`` are the run's head and backbone learning rates."""
        return []

    # ------------------------------------------------------------------ inference settings chosen on validation
    # A head whose test-time score has a free setting (TV-ProxyNet's γ, GraviAlign's inference mode) lists the
    # candidates; evaluation on the validation split scores every candidate from one set of score components,
    # keeps the best by ``train.select_metric`` and stores it in the head (saved with the checkpoint); test
    # evaluation uses the stored setting and reports each baseline setting as extra rows beside it.

    def inference_candidates(self) -> list[dict[str, Any]]:
        """The settings validation chooses among (empty: nothing to choose)."""
        return []

    def inference_setting(self) -> dict[str, Any]:
        """The setting :meth:`score` uses now (saved with the head's state)."""
        return {}

    def set_inference_setting(self, setting: dict[str, Any]) -> None:
        """Make :meth:`score` use ``setting`` (one of :meth:`inference_candidates`)."""
        if setting:
            raise ValueError(f"{type(self).__name__} has no inference setting to set, got {setting!r}")

    def baseline_settings(self) -> dict[str, dict[str, Any]]:
        """Named settings always reported beside the chosen one (e.g. ``{"gamma=0": {"gamma": 0.0}}``)."""
        return {}

    @torch.no_grad()
    def score_components(
        self,
        text_state: Any,
        video_state: Any,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
        settings: list[dict[str, Any]] | None = None,
    ) -> dict[str, Tensor]:
        """Named [N_t, N_v] matrices from which :meth:`combine_scores` builds the score of any candidate setting
        without rescoring (default: the score itself). ``settings``: the settings the caller will combine (the
        evaluator names them; None = any), so a head may skip a component none of them needs."""
        return {"score": self.score(text_state, video_state, text_chunk, video_chunk)}

    def combine_scores(self, components: dict[str, Tensor], setting: dict[str, Any]) -> Tensor:
        """The [N_t, N_v] score of ``setting`` from :meth:`score_components`."""
        return components["score"]

    # ------------------------------------------------------------------ all pairs
    @torch.no_grad()
    def score(
        self,
        text_state: Any,
        video_state: Any,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
    ) -> Tensor:
        """Full N_t × N_v similarity matrix, block by block (float32, on the states' device).

        An indexable head needs no video blocks: each chunk of texts is one matrix product with the gallery. A
        pairwise head scores blocks of ``default_text_chunk`` × ``default_video_chunk`` pairs (PAIRWISE_CHUNK each
        unless the head sets them), never the whole gallery at once."""
        n_t, n_v = len(text_state), len(video_state)
        if self.indexable:
            text_chunk = text_chunk or self.default_text_chunk or INDEXABLE_TEXT_CHUNK
            video_chunk = video_chunk or max(1, n_v)
        else:
            text_chunk = text_chunk or self.default_text_chunk or PAIRWISE_CHUNK
            video_chunk = video_chunk or self.default_video_chunk or PAIRWISE_CHUNK
        rows = []
        for a in range(0, n_t, text_chunk):
            ts = text_state[a : a + text_chunk]
            cols = [self.score_block(ts, video_state[b : b + video_chunk]).float() for b in range(0, n_v, video_chunk)]
            rows.append(torch.cat(cols, dim=1) if cols else torch.zeros(len(ts), 0))
        if not rows:
            return torch.zeros(n_t, n_v)
        return torch.cat(rows, dim=0)

    # ------------------------------------------------------------------ given pairs
    @torch.no_grad()
    def score_pairs(self, text_state: Any, video_state: Any, text_index: Tensor, video_index: Tensor) -> Tensor:
        """Exact scores of the pairs (text_index[p], video_index[p]): [P], equal to ``score(...)[t, v]``.

        Generic implementation: texts are taken in groups; each group scores the union of the videos its pairs
        name as one block and keeps the requested entries. Heads with a cheaper per-pair path override it."""
        text_index, video_index = check_pairs(text_index, video_index, len(text_state), len(video_state))
        out = torch.empty(text_index.shape[0], dtype=torch.float32)
        if text_index.numel() == 0:
            return out
        order = torch.argsort(text_index, stable=True)
        sorted_t = text_index[order]
        group = max(1, int(self.pair_text_group))
        bounds = torch.searchsorted(sorted_t, torch.arange(0, len(text_state) + group, group))
        for g in range(bounds.shape[0] - 1):
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            if lo == hi:
                continue
            sel = order[lo:hi]
            texts, t_inv = torch.unique(text_index[sel], return_inverse=True)
            videos, v_inv = torch.unique(video_index[sel], return_inverse=True)
            block = self.score(text_state[texts], video_state[videos]).float().cpu()
            out[sel] = block[t_inv, v_inv]
        return out

    # ------------------------------------------------------------------ two-stage
    def shortlist_texts(self, text_state: Any) -> Tensor:
        """Text side of the shortlist embedding [N_t, E]: two-stage scoring ranks videos by the dot product of
        :meth:`shortlist_texts` and :meth:`shortlist_videos`. For an indexable head they are the exact score's
        embeddings (the shortlist is exact); a non-indexable head returns a cheap approximation (GARE: normalised
        t_i and mean frame v̄_j). The default uses the states' ``emb`` field."""
        return _emb(self, text_state)

    def shortlist_videos(self, video_state: Any) -> Tensor:
        """Video side of the shortlist embedding [N_v, E] (build it once per gallery, e.g. for an ANN index)."""
        return _emb(self, video_state)

    @torch.no_grad()
    def rerank(
        self,
        text_state: Any,
        video_state: Any,
        k: int,
        *,
        video_index: Tensor | None = None,
        video_chunk: int = 65536,
    ) -> tuple[Tensor, Tensor]:
        """Two-stage scoring: the top-``k`` videos per text by the shortlist embedding, then their exact scores.

        Returns (video indices [N_t, k], scores [N_t, k]), each row sorted by decreasing exact score.
        ``video_index`` is a precomputed :meth:`shortlist_videos` (built once per gallery). An indexable head's
        shortlist scores are already exact, so no second stage runs. The shortlist streams over the gallery with a
        running top-k (memory O(N_t·(k + chunk)))."""
        n_v = len(video_state)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_v:
            raise ValueError(f"rerank: k = {k!r}, expected an integer with 1 <= k <= number of videos ({n_v})")
        if video_index is None:
            video_index = self.shortlist_videos(video_state)
        if video_index.shape[0] != n_v:
            raise ValueError(f"rerank: video_index has {video_index.shape[0]} rows for {n_v} videos")
        return self._shortlist_then_exact(
            self.shortlist_texts(text_state).float(),
            video_index,
            k,
            video_chunk,
            lambda rows, found: self.score_pairs(text_state, video_state, rows, found),
        )

    def _shortlist_then_exact(
        self, queries: Tensor, gallery: Tensor, k: int, chunk: int, exact: Callable[[Tensor, Tensor], Tensor]
    ) -> tuple[Tensor, Tensor]:
        """The two stages of :meth:`rerank` / :meth:`rerank_texts`: each query's top-``k`` gallery rows by dot
        product, then (a non-indexable head) ``exact(query rows, gallery rows)`` of those pairs, each row sorted by
        decreasing exact score."""
        indices, shortlist_scores = top_k_by_dot(queries, gallery, k, chunk)
        if self.indexable:
            return indices.cpu(), shortlist_scores.cpu()
        n_q = queries.shape[0]
        exact_scores = exact(torch.arange(n_q).repeat_interleave(k), indices.reshape(-1).cpu()).view(n_q, k)
        order = exact_scores.argsort(dim=1, descending=True)
        return indices.cpu().gather(1, order), exact_scores.gather(1, order)

    # ------------------------------------------------------------------ search indexes
    def rerank_state(self, video_state: Any) -> Any:
        """What a search index stores per video to score it exactly later without its features: a dataclass of
        tensors sliceable along dim 0 (``tvr.types.Sliceable``). Default: the video state itself. A head whose exact
        score builds costly per-video intermediates returns them here, so an index computes them once (GARE: the
        factorised scorer's ψ state; TV-ProxyNet: the folded keys and values of every round)."""
        return video_state

    @torch.no_grad()
    def score_rerank(self, text_state: Any, rerank_state: Any) -> Tensor:
        """Exact scores [n_t, n_v] of texts against stored :meth:`rerank_state` rows: equal to :meth:`score` of the
        videos they were made from (up to float rounding). States stored in half precision are scored in float32."""
        return self.score(text_state, widen_half(rerank_state)).float()

    @torch.no_grad()
    def rerank_texts(
        self,
        text_state: Any,
        video_state: Any,
        k: int,
        *,
        text_index: Tensor | None = None,
        text_chunk: int = 65536,
    ) -> tuple[Tensor, Tensor]:
        """Two-stage scoring for video queries (v2t): the top-``k`` texts per video by the shortlist embedding, then
        their exact scores. Returns (text indices [N_v, k], scores [N_v, k]), each row sorted by decreasing exact
        score. ``text_index`` is a precomputed :meth:`shortlist_texts`. Memory O(N_v·(k + chunk))."""
        n_t = len(text_state)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_t:
            raise ValueError(f"rerank_texts: k = {k!r}, expected an integer with 1 <= k <= number of texts ({n_t})")
        if text_index is None:
            text_index = self.shortlist_texts(text_state)
        if text_index.shape[0] != n_t:
            raise ValueError(f"rerank_texts: text_index has {text_index.shape[0]} rows for {n_t} texts")
        return self._shortlist_then_exact(
            self.shortlist_videos(video_state).float(),
            text_index,
            k,
            text_chunk,
            lambda columns, found: self.score_pairs(text_state, video_state, found, columns),
        )

    @torch.no_grad()
    def score_two_stage(self, text_state: Any, video_state: Any, k: int, direction: str = "t2v") -> Tensor:
        """Two-stage scoring as a dense [N_t, N_v] matrix, −inf outside the shortlists, so the ordinary metrics can
        rank it. ``direction="t2v"``: :meth:`rerank` (each text's K videos); ``"v2t"``: :meth:`rerank_texts` (each
        video's K texts), the matrix a video query ranks. Each direction needs its own shortlist: ranking videos
        by the text-shortlisted matrix would let a video compete only with the texts that shortlisted it."""
        if direction == "t2v":
            indices, scores = self.rerank(text_state, video_state, k)
            return rerank_to_dense(indices, scores, len(video_state))
        if direction == "v2t":
            indices, scores = self.rerank_texts(text_state, video_state, k)
            return rerank_to_dense(indices, scores, len(text_state)).t()
        raise ValueError(f"score_two_stage: direction = {direction!r}, expected 't2v' or 'v2t'")

    # ------------------------------------------------------------------ the contract test's oracle
    def reference_pair_scores(self, text: Any, video: Any) -> Tensor:
        """The score of text p with video p for P aligned pairs ([P]), computed from the features
        (``TextFeatures`` / ``VideoFeatures`` of P items each) by the method's plain formula, one pair at a time,
        with none of the fast paths :meth:`score`, :meth:`score_pairs` and :meth:`rerank` use; it honours the
        current inference setting. The contract test (``tests/test_head_contract.py``) checks those three against
        it for every registered head, as HF's model testers check a model against a reference; a head must
        provide it."""
        raise NotImplementedError(
            f"{type(self).__name__} provides no reference_pair_scores(text, video): the per-pair oracle the head "
            "contract test checks score / score_pairs / rerank against (docs/architecture.md)"
        )


# --------------------------------------------------------------------------------------------- helpers


def widen_half(state: Any) -> Any:
    """``state`` with its float16 / bfloat16 tensor fields as float32 (other fields untouched)."""
    if not dataclasses.is_dataclass(state):
        return state
    values = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            values[f.name] = value.float()
    return dataclasses.replace(state, **values) if values else state


def _emb(head: RetrievalHead, state: Any) -> Tensor:
    emb = getattr(state, "emb", None)
    if not isinstance(emb, Tensor):
        raise NotImplementedError(
            f"{type(head).__name__} has no shortlist embedding for two-stage scoring: its states carry no 'emb' "
            "field; override shortlist_texts()/shortlist_videos() or set eval.rerank_k = 0"
        )
    return emb
