"""Evaluation protocols (1:1, paragraph, multi-caption), dual softmax and the metric report files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tvr.eval import dual_softmax, evaluate, group_max, metrics_table, retrieval_metrics, write_metrics
from tvr.eval import postprocess as postprocess_mod
from tvr.eval import protocol as protocol_mod
from tvr.eval.protocol import default_protocol


def approx(d: dict) -> dict:
    return {k: pytest.approx(v, abs=1e-9) for k, v in d.items()}


# ------------------------------------------------------------------------------------------ one-to-one / paragraph


def test_one_to_one_with_permuted_text_order() -> None:
    # texts are listed in a different order than the videos: text k belongs to video tv[k]
    sim = np.array(
        [
            [0.1, 0.8, 0.3],  # text 0 → video 1: rank 1
            [0.5, 0.6, 0.4],  # text 1 → video 2: rank 3
            [0.7, 0.2, 0.9],  # text 2 → video 0: rank 2
        ]
    )
    tv = [1, 2, 0]
    out = evaluate(sim, tv, "one_to_one")
    assert set(out) == {"t2v", "v2t"}
    assert out["t2v"] == approx({"R1": 100 / 3, "R5": 100.0, "R10": 100.0, "MdR": 2.0, "MnR": 2.0})
    # v2t: video 0 (text 2) column [0.1, 0.5, 0.7] → rank 1; video 1 (text 0) [0.8, 0.6, 0.2] → 1;
    # video 2 (text 1) [0.3, 0.4, 0.9] → 2
    assert out["v2t"] == approx({"R1": 200 / 3, "R5": 100.0, "R10": 100.0, "MdR": 1.0, "MnR": 4 / 3})
    # paragraph is the same computation; permuting rows into video order gives the diagonal case
    assert evaluate(sim, tv, "paragraph") == out
    order = np.argsort(tv)
    assert evaluate(sim[order], list(range(3)), "one_to_one") == out


def test_one_to_one_reference_ties_in_both_directions() -> None:
    sim = np.array([[0.5, 0.5], [0.1, 0.2]])
    out = evaluate(sim, [0, 1], "one_to_one", tie_mode="reference")
    # t2v: text 0 tied → entries {1, 2}; text 1 → {1}. v2t: video 0 column [0.5, 0.1] → {1};
    # video 1 column [0.5, 0.2] → {2}
    assert out["t2v"] == approx({"R1": 200 / 3, "R5": 100.0, "R10": 100.0, "MdR": 1.0, "MnR": 4 / 3})
    assert out["v2t"] == approx({"R1": 50.0, "R5": 100.0, "R10": 100.0, "MdR": 1.5, "MnR": 1.5})
    assert evaluate(sim, [0, 1], "one_to_one")["t2v"]["R1"] == 100.0


def test_one_to_one_rejects_non_permutation() -> None:
    with pytest.raises(ValueError, match=r"videos with no text: 2.*several texts: 0"):
        evaluate(np.zeros((3, 3)), [0, 0, 1], "one_to_one")
    with pytest.raises(ValueError, match="square"):
        evaluate(np.zeros((3, 4)), [0, 1, 2], "paragraph")
    with pytest.raises(ValueError, match="protocol"):
        evaluate(np.zeros((2, 2)), [0, 1], "1k-A")


# ------------------------------------------------------------------------------------------ multi-caption

# 5 captions of 3 videos (captions 0, 1 → video 0; 2 → video 1; 3, 4 → video 2)
MC_SIM = np.array(
    [
        [0.9, 0.1, 0.3],  # GT v0 → rank 1
        [0.2, 0.5, 0.2],  # GT v0 → rank 2 (tied with v2, which comes after it)
        [0.4, 0.4, 0.8],  # GT v1 → optimistic 2; stable 3 (tied with v0, which comes before it)
        [0.1, 0.6, 0.7],  # GT v2 → rank 1
        [0.95, 0.0, 0.3],  # GT v2 → rank 2
    ]
)
MC_TV = [0, 0, 1, 2, 2]


def test_multi_caption_hand_computed() -> None:
    out = evaluate(MC_SIM, MC_TV, "multi_caption")
    assert out["t2v"] == approx({"R1": 40.0, "R5": 100.0, "R10": 100.0, "MdR": 2.0, "MnR": 8 / 5})
    # group max M[g, v]: g0 = [0.9, 0.5, 0.3], g1 = [0.4, 0.4, 0.8], g2 = [0.95, 0.6, 0.7]
    # video queries rank groups (Mᵀ): v0 [0.9, 0.4, 0.95] → 2; v1 [0.5, 0.4, 0.6] → 3; v2 [0.3, 0.8, 0.7] → 2
    assert out["v2t"] == approx({"R1": 0.0, "R5": 100.0, "R10": 100.0, "MdR": 2.0, "MnR": 7 / 3})
    m = group_max(torch.from_numpy(MC_SIM), torch.tensor(MC_TV), 3)
    assert np.allclose(m.numpy(), [[0.9, 0.5, 0.3], [0.4, 0.4, 0.8], [0.95, 0.6, 0.7]])


def test_multi_caption_reference_t2v_stable_ties() -> None:
    out = evaluate(MC_SIM, MC_TV, "multi_caption", tie_mode="reference")
    # stable ranks [1, 2, 3, 1, 2]
    assert out["t2v"] == approx({"R1": 40.0, "R5": 100.0, "R10": 100.0, "MdR": 2.0, "MnR": 9 / 5})
    # v2t matrix has no ties → same as optimistic
    assert out["v2t"] == evaluate(MC_SIM, MC_TV, "multi_caption")["v2t"]


def test_multi_caption_reference_lower_median_and_dropped_padding() -> None:
    sim = np.array(
        [
            [0.9, 0.1, 0.2],  # GT v0 → 1
            [0.1, 0.9, 0.2],  # GT v1 → 1
            [0.1, 0.5, 0.3],  # GT v2 → 2
            [0.1, 0.5, 0.3],  # GT v0 → 3
            [0.2, -np.inf, 0.1],  # GT v1 is −inf: optimistic rank 3, dropped by the reference (padding value)
        ]
    )
    tv = [0, 1, 2, 0, 1]
    ref = evaluate(sim, tv, "multi_caption", tie_mode="reference")["t2v"]
    # reference ranks [1, 1, 2, 3]: torch's lower median = 1, mean 7/4
    assert ref == approx({"R1": 50.0, "R5": 100.0, "R10": 100.0, "MdR": 1.0, "MnR": 7 / 4})
    opt = evaluate(sim, tv, "multi_caption")["t2v"]
    # optimistic ranks [1, 1, 2, 3, 3]
    assert opt == approx({"R1": 40.0, "R5": 100.0, "R10": 100.0, "MdR": 2.0, "MnR": 2.0})


def test_multi_caption_missing_video_is_named() -> None:
    with pytest.raises(ValueError, match=r"videos without one: 1, 3"):
        evaluate(np.zeros((3, 4)), [0, 2, 2], "multi_caption")


def test_multi_caption_large_matches_naive(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(7)
    n_v = 50
    tv = torch.cat([torch.arange(n_v), torch.randint(0, n_v, (450,), generator=g)])
    tv = tv[torch.randperm(len(tv), generator=g)]
    sim = torch.randn(len(tv), n_v, generator=g)
    naive = torch.stack([sim[tv == v].max(dim=0).values for v in range(n_v)])
    monkeypatch.setattr(protocol_mod, "CHUNK_ELEMENTS", 200)  # several scatter chunks
    assert torch.equal(group_max(sim, tv, n_v), naive)
    out = evaluate(sim, tv.tolist(), "multi_caption")
    assert out["t2v"] == retrieval_metrics(sim, tv)
    assert out["v2t"] == retrieval_metrics(naive.t().contiguous())


# ------------------------------------------------------------------------------------------ DSL


def dsl_formula(s: torch.Tensor, dim: int, temp: float = 100.0) -> torch.Tensor:
    e = torch.exp(temp * s - (temp * s).max(dim=dim, keepdim=True).values)
    return s * e / e.sum(dim=dim, keepdim=True)


def test_dual_softmax_matches_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(8)
    s = torch.rand(37, 23, generator=g, dtype=torch.float64) * 0.4
    for dim in (0, 1):
        want = dsl_formula(s, dim)
        assert torch.allclose(dual_softmax(s, dim=dim), want, rtol=1e-12, atol=0)
        monkeypatch.setattr(postprocess_mod, "CHUNK_ELEMENTS", 50)  # one or two columns/rows per slice
        assert torch.allclose(dual_softmax(s, dim=dim), want, rtol=1e-12, atol=0)
        monkeypatch.undo()
    out = dual_softmax(s.numpy(), temperature=10.0)
    assert isinstance(out, np.ndarray) and np.allclose(out, dsl_formula(s, 0, 10.0).numpy())
    # NaN is treated as −inf: it leaves the other entries of its column untouched and gets no weight
    s2 = s.clone()
    s2[3, 4] = float("nan")
    d = dual_softmax(s2)
    assert torch.allclose(d[:, 5:], dsl_formula(s, 0)[:, 5:])
    keep = torch.ones(37, dtype=torch.bool)
    keep[3] = False
    assert torch.allclose(d[keep, 4], dsl_formula(s[keep], 0)[:, 4])


def test_evaluate_with_dsl_entries() -> None:
    g = torch.Generator().manual_seed(9)
    s = torch.randn(30, 30, generator=g, dtype=torch.float64) * 0.1
    tv = torch.randperm(30, generator=g)
    out = evaluate(s, tv, "one_to_one", dsl=True)
    assert list(out) == ["t2v", "v2t", "t2v_dsl", "v2t_dsl"]
    assert out["t2v_dsl"] == retrieval_metrics(dsl_formula(s, 0), tv)
    inverse = torch.argsort(tv)
    assert out["v2t_dsl"] == retrieval_metrics(dsl_formula(s.t(), 0), inverse)
    assert "t2v_dsl" not in evaluate(s, tv, "one_to_one")

    mc = evaluate(MC_SIM, MC_TV, "multi_caption", dsl=True)
    s_mc = torch.from_numpy(MC_SIM)
    assert mc["t2v_dsl"] == retrieval_metrics(dsl_formula(s_mc, 0), MC_TV)
    m = group_max(s_mc, torch.tensor(MC_TV), 3)
    assert mc["v2t_dsl"] == retrieval_metrics(dsl_formula(m.t(), 0))


def test_default_protocol() -> None:
    assert default_protocol("msvd") == "multi_caption"
    assert default_protocol("didemo") == "paragraph"
    with pytest.raises(ValueError, match="generic"):
        default_protocol("generic")


# ------------------------------------------------------------------------------------------ report


def test_write_metrics_round_trip(tmp_path) -> None:
    metrics = evaluate(MC_SIM, MC_TV, "multi_caption", dsl=True)
    extra = {"protocol": "multi_caption", "n_texts": np.int64(5), "checkpoint": tmp_path / "best.pt"}
    json_path, md_path = write_metrics(tmp_path / "run", metrics, extra)
    back = json.loads(json_path.read_text())
    assert list(back)[:4] == ["t2v", "v2t", "t2v_dsl", "v2t_dsl"]
    for key in ("t2v", "v2t", "t2v_dsl", "v2t_dsl"):
        assert back[key] == metrics[key]
    assert back["n_texts"] == 5 and back["checkpoint"] == str(tmp_path / "best.pt")
    md = md_path.read_text()
    assert "| t2v | 40.0 | 100.0 | 100.0 | 2.0 | 1.6 |" in md
    assert "| v2t | 0.0 | 100.0 | 100.0 | 2.0 | 2.3 |" in md
    assert "**protocol**" in md
    assert not list((tmp_path / "run").glob(".*.tmp"))
    with pytest.raises(ValueError, match="collide"):
        write_metrics(tmp_path, metrics, {"t2v": 1})


def test_metrics_notes_name_the_setting_and_the_chance_level(tmp_path) -> None:
    from tvr.eval import chance_metrics, metrics_notes

    assert chance_metrics(1000) == {"R1": 0.1, "R5": 0.5, "R10": 1.0, "MdR": 500.5, "MnR": 500.5}
    assert chance_metrics(4) == {"R1": 25.0, "R5": 100.0, "R10": 100.0, "MdR": 2.5, "MnR": 2.5}
    # a random ranking's expected metrics, by brute force over every permutation of a 4-item gallery
    import itertools

    ranks = [perm.index(0) + 1 for perm in itertools.permutations(range(4))]
    assert np.mean(ranks) == chance_metrics(4)["MnR"] and np.mean([r <= 1 for r in ranks]) * 100 == 25.0
    with pytest.raises(ValueError, match="positive integer"):
        chance_metrics(0)

    metrics = evaluate(MC_SIM, MC_TV, "multi_caption")
    metrics["t2v@gamma=0"] = metrics["t2v"]
    info = {
        "num_texts": 5,
        "num_videos": 3,
        "protocol": "multi_caption",
        "inference_setting": {"gamma": 0.3},
        "inference_selection": [{}, {}, {}],
    }
    notes = metrics_notes(metrics, info)
    assert notes == [
        "Inference setting: gamma = 0.3, chosen on this split among 3 candidates; rows `…@gamma=0`: the same model "
        "with that setting.",
        "Chance level (a random ranking): t2v R@1 33.3, R@5 100, R@10 100, MdR 2.0, MnR 2.0 (3 videos); "
        "v2t R@1 33.3, R@5 100, R@10 100, MdR 2.0, MnR 2.0 (3 caption groups).",
    ]
    _, md_path = write_metrics(tmp_path, metrics, info)
    assert all(line in md_path.read_text() for line in notes)
    one_to_one = metrics_notes(metrics, {"num_texts": 1000, "num_videos": 1000, "protocol": "one_to_one"})
    assert one_to_one == [
        "Chance level (a random ranking): t2v R@1 0.1, R@5 0.5, R@10 1, MdR 500.5, MnR 500.5 "
        "(1000 videos); v2t R@1 0.1, R@5 0.5, R@10 1, MdR 500.5, MnR 500.5 (1000 captions)."
    ]


def test_metrics_table_exact() -> None:
    row = {"R1": 44.5, "R5": 71.44, "R10": 81.66, "MdR": 2.0, "MnR": 15.25}
    table = metrics_table({"v2t": row, "t2v": row, "note": "ignored"})
    assert table == (
        "| | R@1 | R@5 | R@10 | MdR | MnR |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        "| t2v | 44.5 | 71.4 | 81.7 | 2.0 | 15.2 |\n"
        "| v2t | 44.5 | 71.4 | 81.7 | 2.0 | 15.2 |\n"
    )
    with pytest.raises(ValueError, match="no metric entries"):
        metrics_table({"note": "x"})
