"""Evaluate a model on a split: encode every caption and video once, score all pairs with the head, rank.

Unreadable videos are left out of the gallery together with their captions, and reported by id in the result
(``skipped_videos``), so one bad file never stops an evaluation.

Query banks (``eval.qbnorm`` / ``eval.inverted_softmax``): the caller encodes training captions with the model being
evaluated and passes them as ``evaluate_encoded(..., query_bank=TextFeatures)``; :func:`training_query_bank` does
that for a config (from the video-free text side only: caption strings through the backbone, or the feature cache's
text features). The bank is scored against the evaluated gallery in blocks of ``QUERY_BANK_BLOCK`` captions, so only
per-video statistics are ever kept. The extra rows never replace ``t2v`` / ``v2t``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tvr.config import Config
from tvr.data.feature_cache import FeatureCacheError
from tvr.eval.sharding import gather_encoded, gather_lists, gather_rows, shard_of
from tvr.models.heads.common import rerank_to_dense
from tvr.models.model import RetrievalModel
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard, is_main_process
from tvr.utils.errors import UserError
from tvr.utils.metric_paths import higher_is_better, lookup_metric
from tvr.utils.parallel import loader_workers
from tvr.utils.progress import progress_bar


class NothingToEvaluateError(UserError, RuntimeError):
    """Every video (or every caption) of a split was unreadable or missing."""


@dataclass
class EncodedSplit:
    text: TextFeatures
    video: VideoFeatures  # after the temporal module
    text_video: list[int]  # gallery index of each kept caption's video
    video_ids: list[str]
    protocol: str
    skipped: list[dict] = field(default_factory=list)
    #: captions and videos the split lists (before unreadable videos and their captions were left out)
    expected_texts: int | None = None
    expected_videos: int | None = None


def _move(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in batch.items()}


def _filter(split_videos: list[str], text_video: list[int], kept_ids: list[str]) -> tuple[list[int], list[int]]:
    """Map the split's text→video indices onto the kept gallery; return (kept text rows, their new video index)."""
    position = {vid: k for k, vid in enumerate(kept_ids)}
    rows, targets = [], []
    for row, video_index in enumerate(text_video):
        new = position.get(split_videos[video_index])
        if new is not None:
            rows.append(row)
            targets.append(new)
    return rows, targets


@torch.no_grad()
def encode_split_raw(
    model: RetrievalModel, split, tokenizer, cfg: Config, device: torch.device, *, distributed: bool = False
) -> EncodedSplit:
    """Encode a split from video files and caption strings. ``distributed``: every rank of the process group encodes
    its share and gets the whole encoded split (every rank must call it; :mod:`tvr.eval.sharding`)."""
    from tvr.data.datasets import VideoDataset, VideoResolver, collate_videos

    model.eval()
    resolver = VideoResolver.from_config(cfg.data)
    mine = _shard(len(split.videos), distributed)
    dataset = VideoDataset(split.videos[mine.rows], split.video_spans[mine.rows], resolver, cfg.data)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=cfg.eval.batch_size,
        num_workers=loader_workers(cfg.data.num_workers),
        collate_fn=collate_videos,
    )
    videos, kept, skipped = [], [], []
    for batch in progress_bar(loader, f"{split.name}: videos"):
        skipped.extend({"id": i, "error": e} for i, e in zip(batch["skipped"], batch["errors"], strict=True))
        if not batch["video_ids"]:
            continue
        videos.append(model.video_features(_move(batch, device)).to("cpu", torch.float32))
        kept.extend(batch["video_ids"])
    video = VideoFeatures.cat(videos) if videos else None
    if distributed:
        video = gather_encoded(video, VideoFeatures, device)
        kept, skipped = gather_lists(kept), gather_lists(skipped)
    rows, targets = _filter(split.videos, split.text_video, kept)
    texts = [split.texts[r] for r in rows]
    share = _shard(len(texts), distributed)
    parts = []
    for start in progress_bar(range(share.start, share.stop, cfg.eval.batch_size), f"{split.name}: texts"):
        ids, mask = tokenizer(texts[start : min(start + cfg.eval.batch_size, share.stop)], cfg.data.max_words)
        feats = model.text_features({"text_ids": ids.to(device), "text_mask": mask.to(device)})
        parts.append(feats.to("cpu", torch.float32))
    text = TextFeatures.cat(parts) if parts else None
    if distributed:
        text = gather_encoded(text, TextFeatures, device)
    if video is None or text is None:
        raise NothingToEvaluateError(f"{split.name}: nothing to evaluate ({len(skipped)} videos unreadable)")
    return EncodedSplit(text, video, targets, kept, split.protocol, skipped, len(split.texts), len(split.videos))


def _shard(n: int, distributed: bool) -> RowShard:
    """This rank's share of ``n`` items when the work is shared among the ranks, else all of them."""
    return shard_of(n) if distributed else RowShard.whole(n)


@torch.no_grad()
def cached_text_features(
    model: RetrievalModel, cached, rows: list[int], cfg: Config, device: torch.device
) -> TextFeatures:
    """Cached caption features of ``rows`` as the model sees them: through its bridge when it has one (a two-tower
    cache holds tower features), else as stored."""
    if model.bridge is None:
        return TextFeatures(cached.eot[rows].float(), cached.words[rows].float(), cached.word_mask[rows])
    parts = []
    for start in range(0, len(rows), cfg.eval.batch_size):
        part = rows[start : start + cfg.eval.batch_size]
        batch = {
            "text_eot": cached.eot[part].float().to(device),
            "text_words": cached.words[part].float().to(device),
            "text_word_mask": cached.word_mask[part].to(device),
        }
        parts.append(model.text_features(batch).to("cpu", torch.float32))
    if not parts:
        return model.text_features(
            {"text_eot": cached.eot[:0].float().to(device), "text_words": None, "text_word_mask": None}
        ).to("cpu", torch.float32)
    return TextFeatures.cat(parts)


@torch.no_grad()
def encode_split_cached(
    model: RetrievalModel, split, cached, cfg: Config, device: torch.device, *, distributed: bool = False
) -> EncodedSplit:
    """Encode a split from a feature cache (only the temporal module runs). ``distributed`` as in
    :func:`encode_split_raw`."""
    model.eval()
    if cached.texts != list(split.texts):
        raise FeatureCacheError(
            f"{split.name}: the feature cache's captions do not match the annotation files; rebuild it"
        )
    kept_video_rows = {vid: k for k, vid in enumerate(cached.video_ids)}
    gallery_rows = [kept_video_rows[v] for v in split.videos if v in kept_video_rows]
    kept = [cached.video_ids[r] for r in gallery_rows]
    mine = _shard(len(gallery_rows), distributed)
    videos = []
    for start in range(mine.start, mine.stop, cfg.eval.batch_size):
        rows = gallery_rows[start : min(start + cfg.eval.batch_size, mine.stop)]
        batch = {
            "frame_feats": cached.frames[rows].float().to(device),
            "video_mask": cached.frame_mask[rows].to(device),
        }
        if cached.proxies is not None:
            batch["video_proxies"] = cached.proxies[rows].float().to(device)
        videos.append(model.video_features(batch).to("cpu", torch.float32))
    video = VideoFeatures.cat(videos) if videos else None
    rows, targets = _filter(split.videos, split.text_video, kept)
    share = _shard(len(rows), distributed)
    text = None
    if share.stop > share.start or not distributed:
        text = cached_text_features(model, cached, rows[share.rows], cfg, device)
    if distributed:
        video = gather_encoded(video, VideoFeatures, device)
        text = gather_encoded(text, TextFeatures, device)
    if video is None or text is None:
        raise NothingToEvaluateError(f"{split.name}: nothing to evaluate (no cached video or caption)")
    skipped = [
        {"id": v, "error": "unreadable when the cache was built"} for v in split.videos if v not in kept_video_rows
    ]
    return EncodedSplit(text, video, targets, kept, split.protocol, skipped, len(split.texts), len(split.videos))


@torch.no_grad()
def score_matrices(
    model: RetrievalModel, encoded: EncodedSplit, cfg: Config, device: torch.device
) -> tuple[Tensor, Tensor | None]:
    """(the [N_t, N_v] matrix text queries rank, the one video queries rank or None when it is the same) for an
    encoded split with the head's current inference setting, as :func:`evaluate_encoded` ranks them (under
    ``eval.rerank_k`` each direction has its own shortlists, :func:`shortlist_matrix`)."""
    head = model.head
    head.eval()
    return _score_states(head, *_states(head, encoded, device), cfg, encoded.text_video)


def score_encoded(model: RetrievalModel, encoded: EncodedSplit, cfg: Config, device: torch.device) -> Tensor:
    """The [N_t, N_v] matrix text queries rank (:func:`score_matrices`' first)."""
    return score_matrices(model, encoded, cfg, device)[0]


def _states(head: Any, encoded: EncodedSplit, device: torch.device) -> tuple[Any, Any]:
    return head.encode_texts(encoded.text.to(device)), head.encode_videos(encoded.video.to(device))


def _two_stage(head: Any, k: int, n_videos: int) -> bool:
    return k > 0 and not head.indexable and n_videos > k


def _score_states(
    head: Any,
    text_state: Any,
    video_state: Any,
    cfg: Config,
    text_video: list[int],
    distributed: bool = False,
    device: torch.device | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(the matrix t2v ranks, the matrix v2t ranks or None when it is the same one), both [N_t, N_v] on CPU.

    Exhaustive: every pair's exact score, for both directions. Two-stage (``eval.rerank_k`` = K on a non-indexable
    head; an indexable head always scores exactly, its exhaustive scoring is one matrix product): each text
    shortlists K videos and each video K texts by the head's shortlist embedding, and the shortlisted pairs get
    the exact score (:func:`shortlist_matrix`). ``distributed``: each rank scores its share of the texts (t2v rows)
    and, two-stage, its share of the videos (v2t: a video's shortlist needs every text), and the matrices are
    gathered on every rank."""
    texts_shard = _shard(len(text_state), distributed)
    own_texts = text_state[texts_shard.rows] if distributed else text_state
    k = cfg.eval.rerank_k
    if _two_stage(head, k, len(video_state)):
        pairs_text = torch.arange(len(text_video))
        pairs_video = torch.as_tensor(text_video, dtype=torch.long)
        mine = (pairs_text >= texts_shard.start) & (pairs_text < texts_shard.stop)
        t2v_idx, t2v_scores = head.rerank(own_texts, video_state, k)
        t2v = shortlist_matrix(
            t2v_idx, t2v_scores, len(video_state), pairs_text[mine] - texts_shard.start, pairs_video[mine]
        )
        videos_shard = _shard(len(video_state), distributed)
        own_videos = video_state[videos_shard.rows] if distributed else video_state
        mine = (pairs_video >= videos_shard.start) & (pairs_video < videos_shard.stop)
        v2t_idx, v2t_scores = head.rerank_texts(text_state, own_videos, min(k, len(text_state)))
        v2t = shortlist_matrix(
            v2t_idx, v2t_scores, len(text_state), pairs_video[mine] - videos_shard.start, pairs_text[mine]
        )
        return gather_rows(t2v, texts_shard, device), gather_rows(v2t, videos_shard, device).t()
    sim = head.score(
        own_texts, video_state, text_chunk=cfg.eval.text_chunk or None, video_chunk=cfg.eval.video_chunk or None
    ).cpu()
    return gather_rows(sim, texts_shard, device), None


def shortlist_matrix(
    indices: Tensor, scores: Tensor, n_gallery: int, match_query: Tensor, match_item: Tensor
) -> Tensor:
    """Two-stage results (each query's shortlisted gallery ``indices`` [N_q, K] and their exact ``scores``) as a
    dense [N_q, n_gallery] matrix the ordinary metrics rank.

    Outside its shortlist a query's row holds a floor below every exact score, and a correct item (the pairs
    ``(match_query[p], match_item[p])``) that the query did not shortlist sits lower still: it was not retrieved,
    so it ranks after every other item (rank = gallery size, in either tie mode). Hence a shortlist never helps a
    query: with an exact shortlist every rank is at least the exhaustive one."""
    indices, scores = indices.cpu(), scores.cpu().float()
    finite = scores[torch.isfinite(scores)]
    low = float(finite.min()) if finite.numel() else 0.0
    floor = low - max(1.0, abs(low))
    below = floor - max(1.0, abs(floor))
    dense = rerank_to_dense(indices, scores, n_gallery, fill=floor)
    shortlisted = torch.zeros(dense.shape, dtype=torch.bool).scatter_(1, indices, True)
    missed = ~shortlisted[match_query, match_item]
    dense[match_query[missed], match_item[missed]] = below
    return dense


def scoring_mode(model: RetrievalModel, encoded: EncodedSplit, cfg: Config) -> str:
    """How :func:`evaluate_encoded` ranks this split, for the metrics report (two-stage deviates from the
    protocol)."""
    k = cfg.eval.rerank_k
    if _two_stage(model.head, k, len(encoded.video)):
        return (
            f"two-stage: each text shortlists {k} videos and each video {min(k, len(encoded.text))} texts by the "
            "head's shortlist embedding, exact rerank; a match outside its shortlist ranks last"
        )
    if k > 0 and model.head.indexable:
        return "exhaustive (eval.rerank_k ignored: an indexable head scores every pair with one matrix product)"
    return "exhaustive"


def _pick(results: list[tuple[dict, dict]], select_metric: str) -> int:
    """Index of the best (setting, metrics) by ``select_metric``; the earliest candidate wins ties."""
    better = higher_is_better(select_metric)
    best = 0
    for k, (_, metrics) in enumerate(results):
        value, top = lookup_metric(metrics, select_metric), lookup_metric(results[best][1], select_metric)
        if (value > top) if better else (value < top):
            best = k
    return best


#: bank captions scored against the gallery per block in QB-Norm / inverted-softmax statistics
QUERY_BANK_BLOCK = 4096


def select_query_bank(num_texts: int, size: int) -> list[int]:
    """Indices of the bank captions: all ``num_texts`` when ``size`` is 0 or larger, else ``size`` evenly spaced
    ones (deterministic, and spread over the whole file rather than its first videos)."""
    if size < 0:
        raise ValueError(f"eval.query_bank_size={size} must be >= 0")
    if size == 0 or size >= num_texts:
        return list(range(num_texts))
    return [int(i) for i in torch.linspace(0, num_texts - 1, size).round().long().tolist()]


@torch.no_grad()
def encode_query_bank(
    model: RetrievalModel, texts: list[str], tokenizer, cfg: Config, device: torch.device
) -> TextFeatures:
    """Encode caption strings with the model's backbone (kept on CPU, float32), ``eval.batch_size`` at a time."""
    if not texts:
        raise ValueError("the query bank is empty (no training captions)")
    model.eval()
    parts = []
    for start in progress_bar(range(0, len(texts), cfg.eval.batch_size), "query bank: texts"):
        ids, mask = tokenizer(texts[start : start + cfg.eval.batch_size], cfg.data.max_words)
        feats = model.text_features({"text_ids": ids.to(device), "text_mask": mask.to(device)})
        parts.append(feats.to("cpu", torch.float32))
    return TextFeatures.cat(parts)


def training_query_bank(
    model: RetrievalModel, cfg: Config, device: torch.device, tokenizer=None
) -> TextFeatures | None:
    """The query bank ``evaluate_encoded`` needs for ``eval.qbnorm`` / ``eval.inverted_softmax``: the training
    split's captions (``eval.query_bank_size`` of them) encoded by ``model``; from the feature cache when
    ``data.features_dir`` is set, else through the backbone with ``tokenizer``. None when neither option is on.

    Encode it again whenever the model changes (every validation of a training run)."""
    if not (cfg.eval.qbnorm or cfg.eval.inverted_softmax):
        return None
    if cfg.data.features_dir:
        from tvr.data.feature_cache import load_cached_split

        cached = load_cached_split(cfg.data.features_dir, "train")
        rows = select_query_bank(len(cached.texts), cfg.eval.query_bank_size)
        return cached_text_features(model, cached, rows, cfg, device)
    from tvr.data.annotations import load_split

    if tokenizer is None:
        raise ValueError("training_query_bank: encoding caption strings needs the tokenizer")
    texts = load_split(cfg.data, "train").texts
    rows = select_query_bank(len(texts), cfg.eval.query_bank_size)
    return encode_query_bank(model, [texts[r] for r in rows], tokenizer, cfg, device)


@torch.no_grad()
def query_bank_statistics(
    model: RetrievalModel, encoded: EncodedSplit, bank: TextFeatures, cfg: Config, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(log_norm [N_v], active [N_v]) of ``bank`` against the gallery of ``encoded`` (see
    :func:`tvr.eval.postprocess.querybank_statistics`), scoring ``QUERY_BANK_BLOCK`` bank captions at a time."""
    from tvr.eval.postprocess import querybank_statistics

    head = model.head
    head.eval()
    video_state = head.encode_videos(encoded.video.to(device))

    def blocks():
        for start in range(0, len(bank), QUERY_BANK_BLOCK):
            state = head.encode_texts(bank[start : start + QUERY_BANK_BLOCK].to(device))
            yield head.score(
                state, video_state, text_chunk=cfg.eval.text_chunk or None, video_chunk=cfg.eval.video_chunk or None
            )

    log_norm, active = querybank_statistics(blocks(), cfg.eval.qbnorm_beta, cfg.eval.qbnorm_k)
    return log_norm.cpu(), active.cpu()


def querybank_rows(
    model: RetrievalModel,
    encoded: EncodedSplit,
    sim: Tensor,
    cfg: Config,
    device: torch.device,
    query_bank: TextFeatures | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The extra metric rows of ``eval.inverted_softmax`` (``t2v_invsoftmax``) and ``eval.qbnorm`` (``t2v_qbnorm``)
    for the plain score matrix ``sim``, and what to add to ``info`` (``{"query_bank": {...}}``); ({}, {}) when both
    are off. ``query_bank``: training captions encoded by ``model`` (:func:`training_query_bank`), needed by
    QB-Norm; the inverted softmax without one normalises over the evaluated queries themselves."""
    from tvr.eval.postprocess import dynamic_inverted_softmax, inverted_softmax, querybank_statistics
    from tvr.eval.protocol import evaluate

    if not (cfg.eval.qbnorm or cfg.eval.inverted_softmax):
        return {}, {}
    beta = cfg.eval.qbnorm_beta
    if query_bank is not None:
        log_norm, active = query_bank_statistics(model, encoded, query_bank, cfg, device)
        bank_info: dict[str, Any] = {
            "source": "training captions",
            "size": len(query_bank),
            "beta": beta,
            "k": cfg.eval.qbnorm_k,
        }
    elif cfg.eval.qbnorm:
        raise ValueError(
            "eval.qbnorm needs a query bank of training captions: pass query_bank= to evaluate_encoded "
            "(tvr.eval.runner.training_query_bank builds it)"
        )
    else:
        log_norm, active = querybank_statistics([sim], beta, cfg.eval.qbnorm_k)
        bank_info = {"source": "evaluated queries", "size": len(encoded.text), "beta": beta}
    rows: dict[str, Any] = {}
    if cfg.eval.inverted_softmax:
        rescored = inverted_softmax(sim, log_norm, beta)
        rows["t2v_invsoftmax"] = evaluate(rescored, encoded.text_video, encoded.protocol, tie_mode=cfg.eval.tie_mode)[
            "t2v"
        ]
    if cfg.eval.qbnorm:
        rescored, normalised = dynamic_inverted_softmax(sim, log_norm, active, beta)
        rows["t2v_qbnorm"] = evaluate(rescored, encoded.text_video, encoded.protocol, tie_mode=cfg.eval.tie_mode)["t2v"]
        bank_info["activation_set"] = int(active.sum())
        bank_info["queries_normalised"] = int(normalised.sum())
    return rows, {"query_bank": bank_info}


@torch.no_grad()
def evaluate_encoded(
    model: RetrievalModel,
    encoded: EncodedSplit,
    cfg: Config,
    device: torch.device,
    *,
    select_inference: bool = False,
    query_bank: TextFeatures | None = None,
    distributed: bool = False,
) -> dict:
    """Score and rank; returns {"t2v": {...}, "v2t": {...}[, "t2v_dsl", "v2t_dsl", "t2v@<baseline>", ...]
    [, "t2v_invsoftmax"][, "t2v_qbnorm"], "info": {...}}.

    ``select_inference`` (validation): a head with inference candidates is scored under each of them from one set
    of score components, the best by ``train.select_metric`` is stored in the head and reported. Otherwise the
    head's stored setting is used. A head's baseline settings are reported as extra rows ``t2v@<name>``.
    ``query_bank`` as in :func:`querybank_rows`. ``distributed``: every rank of the process group scores its share of
    the texts and gets the whole score matrices (every rank must call it; every rank returns the same metrics, but
    the query-bank rows are computed on rank 0 only)."""
    from tvr.eval.postprocess import dual_softmax
    from tvr.eval.protocol import evaluate

    head = model.head
    head.eval()

    def rank(sim: Tensor, v2t_sim: Tensor | None = None) -> dict:
        return evaluate(sim, encoded.text_video, encoded.protocol, tie_mode=cfg.eval.tie_mode, v2t_sim=v2t_sim)

    start = time.perf_counter()
    text_state, video_state = _states(head, encoded, device)
    shard = _shard(len(encoded.text), distributed)
    own_texts = text_state[shard.rows] if distributed else text_state
    candidates = head.inference_candidates() if select_inference else []
    baselines = head.baseline_settings()
    components = None
    if candidates or baselines:
        chunks = {"text_chunk": cfg.eval.text_chunk or None, "video_chunk": cfg.eval.video_chunk or None}
        # only what these settings need: at test time (no candidates) a head skips components of unused settings
        needed = [*candidates, *baselines.values()]
        components = {
            k: gather_rows(v.cpu(), shard, device)
            for k, v in head.score_components(own_texts, video_state, **chunks, settings=needed).items()
        }
    selection = None
    if candidates:
        results = [(setting, rank(head.combine_scores(components, setting))) for setting in candidates]
        chosen = results[_pick(results, cfg.train.select_metric)][0]
        head.set_inference_setting(chosen)
        selection = [{"setting": s, "t2v": m["t2v"], "v2t": m["v2t"]} for s, m in results]
    sim, v2t_sim = _score_states(head, text_state, video_state, cfg, encoded.text_video, distributed, device)
    seconds = time.perf_counter() - start
    metrics = rank(sim, v2t_sim)
    if cfg.eval.dsl:
        dsl = rank(dual_softmax(sim), dual_softmax(v2t_sim) if v2t_sim is not None else None)
        metrics["t2v_dsl"], metrics["v2t_dsl"] = dsl["t2v"], dsl["v2t"]
    for name, setting in baselines.items():
        extra = rank(head.combine_scores(components, setting))
        metrics[f"t2v@{name}"], metrics[f"v2t@{name}"] = extra["t2v"], extra["v2t"]
    rows, info = ({}, {})
    if not distributed or is_main_process():
        rows, info = querybank_rows(model, encoded, sim, cfg, device, query_bank)
    metrics.update(rows)
    metrics["info"] = {
        "num_texts": len(encoded.text),
        "num_videos": len(encoded.video),
        # what the split lists, so a reader sees how much was left out (unreadable videos and their captions)
        "expected_texts": encoded.expected_texts if encoded.expected_texts is not None else len(encoded.text),
        "expected_videos": encoded.expected_videos if encoded.expected_videos is not None else len(encoded.video),
        "protocol": encoded.protocol,
        "tie_mode": cfg.eval.tie_mode,
        "head": cfg.head.name,
        "indexable": bool(head.indexable),
        "scoring": scoring_mode(model, encoded, cfg),
        "scoring_seconds": round(seconds, 4),
        "skipped_videos": encoded.skipped,
        **info,
    }
    if head.inference_setting():
        metrics["info"]["inference_setting"] = head.inference_setting()
    if selection is not None:
        metrics["info"]["inference_selection"] = selection
    return metrics
