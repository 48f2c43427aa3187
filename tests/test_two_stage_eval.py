"""Two-stage evaluation (``eval.rerank_k``): each direction shortlists for its own queries (texts pick K videos,
videos pick K texts), K = N equals exhaustive scoring, and K < N never beats it when the shortlist is exact."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from tvr.config import Config
from tvr.eval.protocol import evaluate
from tvr.eval.runner import EncodedSplit, evaluate_encoded, shortlist_matrix
from tvr.models.heads.base import RetrievalHead
from tvr.models.model import RetrievalModel
from tvr.types import Sliceable, TextFeatures, VideoFeatures

D = 16


@dataclasses.dataclass
class Emb(Sliceable):
    emb: Tensor


class ExactShortlistHead(RetrievalHead):
    """s_ij = t_i · v_j, declared pairwise so that eval.rerank_k applies: its shortlist embedding is the exact
    score, so two-stage scoring can only drop items, never reorder them."""

    indexable = False

    def encode_texts(self, text: TextFeatures) -> Emb:
        return Emb(text.eot.float())

    def encode_videos(self, video: VideoFeatures) -> Emb:
        return Emb(video.frames[:, 0].float())

    def score_block(self, text_state: Emb, video_state: Emb) -> Tensor:
        return text_state.emb @ video_state.emb.T

    def loss(self, text: TextFeatures, video: VideoFeatures, shard=None) -> dict[str, Tensor]:  # pragma: no cover
        raise NotImplementedError

    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:  # pragma: no cover
        return (text.eot * video.frames[:, 0]).sum(-1)


def split(n_videos: int, captions: int, seed: int) -> EncodedSplit:
    """Random features, weakly aligned (text k of video j is near video j), so ranks are spread out."""
    g = torch.Generator().manual_seed(seed)
    videos = torch.randn(n_videos, D, generator=g)
    text_video = [j for j in range(n_videos) for _ in range(captions)]
    texts = 0.4 * videos[text_video] + torch.randn(len(text_video), D, generator=g)
    protocol = "one_to_one" if captions == 1 else "multi_caption"
    return EncodedSplit(
        TextFeatures(texts),
        VideoFeatures(videos[:, None], torch.ones(n_videos, 1)),
        text_video,
        [f"v{j}" for j in range(n_videos)],
        protocol,
    )


def run(encoded: EncodedSplit, k: int, tie_mode: str = "optimistic") -> dict:
    cfg = Config()
    cfg.eval.rerank_k = k
    cfg.eval.tie_mode = tie_mode
    model = RetrievalModel(None, torch.nn.Identity(), ExactShortlistHead(D))
    return evaluate_encoded(model, encoded, cfg, torch.device("cpu"))


def never_better(two_stage: dict, exhaustive: dict) -> None:
    for key in ("R1", "R5", "R10"):
        assert two_stage[key] <= exhaustive[key] + 1e-9, (key, two_stage, exhaustive)
    for key in ("MdR", "MnR"):
        assert two_stage[key] >= exhaustive[key] - 1e-9, (key, two_stage, exhaustive)


@pytest.mark.parametrize("captions", [1, 3], ids=["one_to_one", "multi_caption"])
@pytest.mark.parametrize("tie_mode", ["optimistic", "reference"])
def test_fewer_candidates_never_beat_exhaustive_scoring(captions: int, tie_mode: str) -> None:
    encoded = split(20, captions, seed=1)
    exhaustive = run(encoded, 0, tie_mode)
    assert exhaustive["info"]["scoring"] == "exhaustive"
    for k in (1, 2, 5, 19):
        two_stage = run(encoded, k, tie_mode)
        assert two_stage["info"]["scoring"].startswith(f"two-stage: each text shortlists {k} videos and each video")
        never_better(two_stage["t2v"], exhaustive["t2v"])
        never_better(two_stage["v2t"], exhaustive["v2t"])


def test_the_constructed_case_is_one_where_the_text_shortlist_inflates_v2t() -> None:
    """Ranking videos by the text-shortlisted matrix lets a video compete only with the texts that shortlisted it:
    on this split that v2t R@1 beats the exhaustive one, which per-video shortlists never do."""
    encoded = split(20, 1, seed=1)
    head = ExactShortlistHead(D)
    ts, vs = head.encode_texts(encoded.text), head.encode_videos(encoded.video)
    exhaustive = evaluate(head.score(ts, vs), encoded.text_video, "one_to_one")
    text_shortlisted = evaluate(head.score_two_stage(ts, vs, 2), encoded.text_video, "one_to_one")
    assert text_shortlisted["v2t"]["R1"] > exhaustive["v2t"]["R1"]
    assert run(encoded, 2)["v2t"]["R1"] <= exhaustive["v2t"]["R1"]


@pytest.mark.parametrize("captions", [1, 3], ids=["one_to_one", "multi_caption"])
def test_a_shortlist_as_long_as_the_gallery_is_exhaustive(captions: int) -> None:
    encoded = split(12, captions, seed=2)
    head = ExactShortlistHead(D)
    ts, vs = head.encode_texts(encoded.text), head.encode_videos(encoded.video)
    full = head.score(ts, vs)
    torch.testing.assert_close(head.score_two_stage(ts, vs, len(vs)), full)
    torch.testing.assert_close(head.score_two_stage(ts, vs, len(ts), direction="v2t"), full)
    exhaustive = evaluate(full, encoded.text_video, encoded.protocol)
    # the evaluator's two-stage matrices with every item shortlisted: the exhaustive metrics
    n_t, n_v = full.shape
    texts, videos = torch.arange(n_t), torch.tensor(encoded.text_video)
    t2v = shortlist_matrix(torch.arange(n_v).expand(n_t, -1), full, n_v, texts, videos)
    v2t = shortlist_matrix(torch.arange(n_t).expand(n_v, -1), full.T, n_t, videos, texts).T
    assert evaluate(t2v, encoded.text_video, encoded.protocol, v2t_sim=v2t) == exhaustive


def test_a_match_outside_the_shortlist_ranks_last() -> None:
    """One query, gallery of 5, shortlist {0, 1}: the match 3 is not retrieved, so its rank is the gallery size in
    either tie mode (not K + 1, and the reference tie mode does not drop the query)."""
    indices, scores = torch.tensor([[1, 0]]), torch.tensor([[0.9, 0.2]])
    dense = shortlist_matrix(indices, scores, 5, torch.tensor([0]), torch.tensor([3]))
    assert dense[0, 1] == 0.9 and dense[0, 0] == 0.2
    assert dense[0, 3] < dense[0, 2] == dense[0, 4] < 0.2
    from tvr.eval.metrics import retrieval_metrics

    for tie_mode in ("optimistic", "reference"):
        assert retrieval_metrics(dense, [3], tie_mode)["MnR"] == 5.0


def test_the_analysis_ranks_what_the_evaluator_ranks_under_two_stage_scoring() -> None:
    """tvr analyze reads the same two matrices (score_matrices): its v2t ranks are the evaluator's, not those of the
    text-shortlisted matrix."""
    from tvr.analysis.similarity import protocol_ranks, recall_at
    from tvr.eval.runner import score_matrices

    encoded = split(20, 1, seed=1)
    cfg = Config()
    cfg.eval.rerank_k = 2
    model = RetrievalModel(None, torch.nn.Identity(), ExactShortlistHead(D))
    t2v, v2t = score_matrices(model, encoded, cfg, torch.device("cpu"))
    assert v2t is not None
    ranks = protocol_ranks(t2v, encoded.text_video, encoded.protocol, v2t)
    metrics = run(encoded, 2)
    for direction in ("t2v", "v2t"):
        assert recall_at(ranks[direction]) == pytest.approx(metrics[direction])
