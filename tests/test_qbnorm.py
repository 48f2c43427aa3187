"""Inverted softmax and QB-Norm (dynamic inverted softmax) against direct formulas, and their evaluation rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tvr.config import Config
from tvr.data.tokenizer import build_tokenizer
from tvr.eval.postprocess import dynamic_inverted_softmax, inverted_softmax, qb_norm, querybank_statistics
from tvr.eval.protocol import evaluate
from tvr.eval.runner import EncodedSplit, encode_query_bank, evaluate_encoded, select_query_bank, training_query_bank
from tvr.models.build import build_model
from tvr.models.run_spec import resolve_run
from tvr.types import TextFeatures, VideoFeatures

BETA = 20.0


def naive_log_norm(bank: np.ndarray, beta: float) -> np.ndarray:
    return np.array(
        [math.log(sum(math.exp(beta * bank[b, g]) for b in range(bank.shape[0]))) for g in range(bank.shape[1])]
    )


def naive_activation(bank: np.ndarray, k: int) -> set[int]:
    out: set[int] = set()
    for row in bank:
        out.update(int(j) for j in np.argsort(-row, kind="stable")[:k])
    return out


def naive_qbnorm_rows(sim: np.ndarray, bank: np.ndarray, beta: float, k: int) -> np.ndarray:
    """The paper's form: exp(β s) / Σ_b exp(β s_b) on rows whose top-1 is activated, exp(β s) on the others."""
    active = naive_activation(bank, k)
    denom = np.exp(beta * bank).sum(axis=0)
    out = np.exp(beta * sim)
    for q in range(sim.shape[0]):
        if int(np.argmax(sim[q])) in active:
            out[q] = out[q] / denom
    return out


def test_statistics_match_the_formula_and_do_not_depend_on_blocking() -> None:
    g = torch.Generator().manual_seed(0)
    bank = torch.rand(23, 7, generator=g, dtype=torch.float64) * 2 - 1
    log_norm, active = querybank_statistics([bank], BETA, k=2)
    assert np.allclose(log_norm.numpy(), naive_log_norm(bank.numpy(), BETA), rtol=0, atol=1e-10)
    assert set(torch.nonzero(active).flatten().tolist()) == naive_activation(bank.numpy(), 2)
    blocked = querybank_statistics([bank[:5], bank[5:6], bank[6:6], bank[6:]], BETA, k=2)
    assert torch.allclose(blocked[0], log_norm, rtol=0, atol=1e-12) and torch.equal(blocked[1], active)


def test_inverted_softmax_is_the_log_of_the_formula() -> None:
    g = torch.Generator().manual_seed(1)
    sim = torch.rand(6, 5, generator=g, dtype=torch.float64)
    bank = torch.rand(9, 5, generator=g, dtype=torch.float64)
    log_norm, _ = querybank_statistics([bank], BETA)
    out = inverted_softmax(sim, log_norm, BETA)
    want = np.log(np.exp(BETA * sim.numpy()) / np.exp(BETA * bank.numpy()).sum(axis=0))
    assert np.allclose(out.numpy(), want, rtol=0, atol=1e-10)
    assert isinstance(inverted_softmax(sim.numpy(), log_norm, BETA), np.ndarray)
    with pytest.raises(ValueError, match="log_norm"):
        inverted_softmax(sim, log_norm[:3], BETA)


def test_qbnorm_matches_the_papers_rule_row_by_row() -> None:
    g = torch.Generator().manual_seed(2)
    sim = torch.rand(40, 12, generator=g, dtype=torch.float64)
    bank = torch.rand(30, 12, generator=g, dtype=torch.float64)
    bank[:, 3] += 0.5  # a hub: every bank query retrieves video 3 first
    ours, normalised = dynamic_inverted_softmax(sim, *querybank_statistics([bank], BETA, 1), BETA)
    want = naive_qbnorm_rows(sim.numpy(), bank.numpy(), BETA, 1)
    assert np.allclose(ours.numpy(), np.log(want), rtol=0, atol=1e-9)
    active = naive_activation(bank.numpy(), 1)
    assert normalised.tolist() == [int(np.argmax(r)) in active for r in sim.numpy()]
    assert 0 < int(normalised.sum()) < 40  # both kinds of rows occur
    assert torch.equal(qb_norm(sim, bank, BETA), ours)


def test_qbnorm_damps_a_hub() -> None:
    """Video 0 is a hub: every bank caption prefers it. Query 0 (for video 1) scores the hub slightly higher and is
    fixed by QB-Norm; query 2 (for the hub itself) prefers it by enough to keep it; query 1's best match is not in
    the activation set, so its row is only rescaled."""
    sim = torch.tensor([[0.50, 0.48, 0.10], [0.30, 0.20, 0.60], [0.90, 0.10, 0.20]], dtype=torch.float64)
    bank = torch.tensor([[0.60, 0.20, 0.10], [0.62, 0.25, 0.30], [0.58, 0.10, 0.20]], dtype=torch.float64)
    gt = [1, 2, 0]
    ours, normalised = dynamic_inverted_softmax(sim, *querybank_statistics([bank], BETA), BETA)
    assert normalised.tolist() == [True, False, True]
    assert evaluate(sim, gt, "one_to_one")["t2v"]["R1"] == pytest.approx(200 / 3)
    assert evaluate(ours, gt, "one_to_one")["t2v"]["R1"] == pytest.approx(100.0)
    lse = [math.log(sum(math.exp(BETA * float(b)) for b in bank[:, g])) for g in range(3)]
    assert ours[0].tolist() == pytest.approx([BETA * float(s) - n for s, n in zip(sim[0], lse, strict=True)])
    assert ours[1].tolist() == pytest.approx((BETA * sim[1]).tolist())


def test_edge_cases() -> None:
    sim = torch.tensor([[float("nan"), float("-inf")], [0.1, 0.2]])
    bank = torch.tensor([[0.3, float("-inf")], [0.1, float("nan")]])
    log_norm, active = querybank_statistics([bank], BETA)
    assert torch.isfinite(log_norm).all() and log_norm[1] == log_norm[0]  # unseen item: smallest finite normaliser
    out, normalised = dynamic_inverted_softmax(sim, log_norm, active, BETA)
    assert normalised.tolist() == [False, False]  # row 0 has no finite score; row 1's top-1 (item 1) is not active
    assert torch.isnan(out[0, 0]) and out[1].tolist() == pytest.approx([2.0, 4.0])
    with pytest.raises(ValueError, match="empty"):
        querybank_statistics([torch.zeros(0, 3)])
    with pytest.raises(ValueError, match="k="):
        querybank_statistics([bank], k=0)
    assert select_query_bank(10, 0) == list(range(10)) and select_query_bank(3, 5) == [0, 1, 2]
    assert select_query_bank(10, 4) == [0, 3, 6, 9]


# ------------------------------------------------------------------------------------------------ runner


def _encoded(n: int, dim: int, frames: int, seed: int) -> EncodedSplit:
    g = torch.Generator().manual_seed(seed)
    text = TextFeatures(torch.randn(n, dim, generator=g))
    mask = torch.ones(n, frames, dtype=torch.long)
    mask[::3, -1] = 0
    video = VideoFeatures(torch.randn(n, frames, dim, generator=g), mask)
    return EncodedSplit(text, video, list(range(n)), [f"v{k}" for k in range(n)], "one_to_one")


def test_runner_adds_rows_without_touching_the_plain_ones() -> None:
    cfg = Config()
    cfg.model.temporal = "meanP"
    run = resolve_run(cfg)
    model = build_model(run, cached=True)
    encoded = _encoded(12, run.config.model.tiny.embed_dim, 4, seed=3)
    bank = TextFeatures(torch.randn(50, 64, generator=torch.Generator().manual_seed(4)))
    plain = evaluate_encoded(model, encoded, cfg, torch.device("cpu"))
    cfg.eval.qbnorm = True
    cfg.eval.inverted_softmax = True
    cfg.eval.qbnorm_k = 2
    out = evaluate_encoded(model, encoded, cfg, torch.device("cpu"), query_bank=bank)
    assert out["t2v"] == plain["t2v"] and out["v2t"] == plain["v2t"]

    # independent scores: CLIP4Clip mean pooling = cosine of the text with the masked mean of normalised frames
    def c4c(text: torch.Tensor, video: VideoFeatures) -> np.ndarray:
        frames = F.normalize(video.frames.double(), dim=-1) * video.frame_mask[..., None]
        v = F.normalize(frames.sum(1) / video.frame_mask.sum(1, keepdim=True), dim=-1)
        return (F.normalize(text.double(), dim=-1) @ v.t()).numpy()

    sim, bank_sim = c4c(encoded.text.eot, encoded.video), c4c(bank.eot, encoded.video)
    want_qb = evaluate(np.log(naive_qbnorm_rows(sim, bank_sim, BETA, 2)), encoded.text_video, "one_to_one")["t2v"]
    want_is = evaluate(sim * BETA - naive_log_norm(bank_sim, BETA), encoded.text_video, "one_to_one")["t2v"]
    assert out["t2v_qbnorm"] == want_qb and out["t2v_invsoftmax"] == want_is
    info = out["info"]["query_bank"]
    assert info["size"] == 50 and info["source"] == "training captions"
    assert info["activation_set"] == len(naive_activation(bank_sim, 2))
    assert "v2t_qbnorm" not in out

    with pytest.raises(ValueError, match="query bank"):
        evaluate_encoded(model, encoded, cfg, torch.device("cpu"))
    cfg.eval.qbnorm = False
    transductive = evaluate_encoded(model, encoded, cfg, torch.device("cpu"))
    assert transductive["info"]["query_bank"]["source"] == "evaluated queries"
    want = evaluate(sim * BETA - naive_log_norm(sim, BETA), encoded.text_video, "one_to_one")["t2v"]
    assert transductive["t2v_invsoftmax"] == want


def test_query_bank_from_training_captions(tmp_path) -> None:
    (tmp_path / "captions.csv").write_text(
        "video,caption,split\n"
        + "".join(f"v{k},caption number {k} of a dog,train\n" for k in range(7))
        + "t0,a test caption,test\n"
    )
    cfg = Config()
    cfg.data.dataset, cfg.data.annotations, cfg.data.val_fraction = "generic", str(tmp_path), 0.0
    cfg.eval.batch_size = 3
    model = build_model(resolve_run(cfg)).eval()
    tokenizer = build_tokenizer(resolve_run(cfg).tokenizer, tmp_path)
    assert training_query_bank(model, cfg, torch.device("cpu"), tokenizer) is None  # neither option is on
    cfg.eval.qbnorm, cfg.eval.query_bank_size = True, 4
    bank = training_query_bank(model, cfg, torch.device("cpu"), tokenizer)
    texts = [f"caption number {k} of a dog" for k in (0, 2, 4, 6)]
    ids, mask = tokenizer(texts, cfg.data.max_words)
    with torch.no_grad():
        want = model.text_features({"text_ids": ids, "text_mask": mask})
    assert len(bank) == 4 and torch.allclose(bank.eot, want.eot, atol=1e-6, rtol=0)
    assert torch.equal(encode_query_bank(model, texts, tokenizer, cfg, torch.device("cpu")).eot, bank.eot)


def test_train_and_eval_report_qbnorm_rows_with_a_training_query_bank(tmp_path) -> None:
    """Through the pipeline: the bank is the training captions encoded by the evaluated model; the plain rows stay."""
    import json

    from test_end_to_end import make_msrvtt

    from tvr.config import config_from_dict
    from tvr.pipeline import run_train

    values = make_msrvtt(tmp_path / "data")
    values["eval"].update({"qbnorm": True, "inverted_softmax": True})
    values["train"]["max_steps"] = 2
    run_train(config_from_dict(values), tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "test_best" / "metrics.json").read_text())
    assert {"t2v", "v2t", "t2v_qbnorm", "t2v_invsoftmax"} <= set(metrics)
    assert metrics["query_bank"]["source"] == "training captions" and metrics["query_bank"]["size"] > 0
