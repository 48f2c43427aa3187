"""The head contract, checked for every registered head (and heads defined outside the package, by import path):
build from a config, train on a fixed batch, chunked == unchunked scoring, exact pair scores, two-stage with K = N
equal to exhaustive scoring in both directions, every fast path against the head's own per-pair oracle
(``reference_pair_scores``, as HF's model testers check a model against a reference), and a checkpoint round trip;
the registry's errors name what is wrong."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tvr.config import ConfigError, HeadConfig, config_from_dict, load_config, trusting_code
from tvr.models.heads import registry
from tvr.models.heads.base import LN_100, PAIRWISE_CHUNK, RetrievalHead
from tvr.models.heads.common import top_k_by_dot
from tvr.models.model import RetrievalModel
from tvr.train.checkpoint import load_checkpoint, save_checkpoint
from tvr.types import TextFeatures, VideoFeatures

D, FRAMES, WORDS, PROXIES = 32, 5, 6, 4
HEADS = registry.available_heads()
TOY = "toy_heads:BilinearHead"
#: a non-indexable head with an inference setting (γ), defined outside the package
MIXTURE = "toy_heads:MixtureHead"


def features(n_t: int, n_v: int, seed: int = 0) -> tuple[TextFeatures, VideoFeatures]:
    """Aligned pairs (text k describes video k when n_t == n_v) carrying every field a head may use."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(max(n_t, n_v), D, generator=g)
    word_mask = (torch.arange(WORDS)[None] < torch.randint(2, WORDS + 1, (n_t, 1), generator=g)).long()
    text = TextFeatures(
        base[:n_t] + 0.3 * torch.randn(n_t, D, generator=g),
        torch.randn(n_t, WORDS, D, generator=g) + base[:n_t, None],
        word_mask,
    )
    frame_mask = (torch.arange(FRAMES)[None] < torch.randint(1, FRAMES + 1, (n_v, 1), generator=g)).long()
    frames = base[:n_v, None] + 0.5 * torch.randn(n_v, FRAMES, D, generator=g)
    proxies = base[:n_v, None] + 0.5 * torch.randn(n_v, PROXIES, D, generator=g)
    return text, VideoFeatures(frames, frame_mask, proxies)


def build(name: str, seed: int = 0, logit_scale: float = LN_100) -> RetrievalHead:
    torch.manual_seed(seed)
    return registry.build_head(HeadConfig(name=name, logit_scale_init=logit_scale), D, LN_100)


@pytest.fixture(params=HEADS + [TOY, MIXTURE])
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_builtin_heads_are_discovered() -> None:
    assert {"clip4clip", "gare", "proxy", "gravialign"} <= set(HEADS)


def test_contract_build_and_options(name: str) -> None:
    head = build(name)
    assert isinstance(head, RetrievalHead) and dataclasses.is_dataclass(head.options)
    assert head.options == type(head).Options()  # defaults when the config gives none
    assert isinstance(head.indexable, bool)
    with pytest.raises(ConfigError, match=r"head.options: unknown key\(s\) \['no_such_option'\]; valid keys"):
        registry.head_options(name, {"no_such_option": 1})
    # the options `tvr demo --method` applies are valid options of the head
    registry.head_options(name, dict(type(head).demo_options))


def test_contract_loss_falls_on_a_fixed_batch(name: str) -> None:
    # temperature 1 (log scale 0): far from a saturated loss even for a head whose only parameter is the scale
    head = build(name, logit_scale=0.0)
    text, video = features(8, 8)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)

    def eval_loss() -> float:
        head.eval()
        with torch.no_grad():
            return float(head.loss(text, video)["loss"])

    before = eval_loss()
    for _ in range(15):
        head.train()
        out = head.loss(text, video)
        assert set(out) >= {"loss"} and out["loss"].ndim == 0
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        head.clamp_logit_scale()
    after = eval_loss()
    assert after < before, (before, after)


def test_contract_chunked_scoring_pairs_and_two_stage(name: str) -> None:
    head = build(name).eval()
    text, video = features(7, 9, seed=1)
    ts, vs = head.encode_texts(text), head.encode_videos(video)
    full = head.score(ts, vs)
    assert full.shape == (7, 9) and full.dtype == torch.float32 and torch.isfinite(full).all()
    torch.testing.assert_close(head.score(ts, vs, text_chunk=3, video_chunk=2), full, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(head.score_block(ts, vs).float(), full, rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(2)
    ti, vi = torch.randint(0, 7, (40,), generator=g), torch.randint(0, 9, (40,), generator=g)
    torch.testing.assert_close(head.score_pairs(ts, vs, ti, vi), full[ti, vi], rtol=1e-5, atol=1e-5)
    # two-stage with K = N ranks the whole gallery exactly, in both directions
    torch.testing.assert_close(head.score_two_stage(ts, vs, 9), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.score_two_stage(ts, vs, 7, direction="v2t"), full, rtol=1e-5, atol=1e-5)
    idx, scores = head.rerank(ts, vs, 4)
    assert idx.shape == scores.shape == (7, 4) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    torch.testing.assert_close(scores, full.gather(1, idx), rtol=1e-5, atol=1e-5)
    shortlist = top_k_by_dot(head.shortlist_texts(ts), head.shortlist_videos(vs), 4)[0]
    assert torch.equal(idx.sort(1).values, shortlist.sort(1).values)
    # v2t: each video shortlists its own texts
    idx, scores = head.rerank_texts(ts, vs, 3)
    assert idx.shape == scores.shape == (9, 3) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    torch.testing.assert_close(scores, full.T.gather(1, idx), rtol=1e-5, atol=1e-5)
    shortlist = top_k_by_dot(head.shortlist_videos(vs), head.shortlist_texts(ts), 3)[0]
    assert torch.equal(idx.sort(1).values, shortlist.sort(1).values)
    if head.indexable:  # the score is the dot product of the shortlist embeddings
        torch.testing.assert_close(head.shortlist_texts(ts) @ head.shortlist_videos(vs).T, full, rtol=1e-5, atol=1e-5)


def _settings_to_check(head: RetrievalHead) -> list[dict]:
    """The stored inference setting, every baseline, and the first, middle and last candidate."""
    candidates = head.inference_candidates()
    picked = [head.inference_setting(), *head.baseline_settings().values()]
    picked += [candidates[k] for k in sorted({0, len(candidates) // 2, len(candidates) - 1})] if candidates else []
    unique: list[dict] = []
    for setting in picked:
        if setting not in unique:
            unique.append(setting)
    return unique


def test_contract_fast_paths_match_the_heads_own_oracle(name: str) -> None:
    """score, score_pairs, rerank and rerank_texts against ``reference_pair_scores``: the head's plain per-pair
    formula, computed from the features one pair at a time, under each inference setting."""
    head = build(name).eval()
    text, video = features(6, 8, seed=5)
    ti = torch.arange(6).repeat_interleave(8)
    vi = torch.arange(8).repeat(6)
    for setting in _settings_to_check(head):
        head.set_inference_setting(setting)
        reference = head.reference_pair_scores(text[ti], video[vi]).view(6, 8)
        assert reference.shape == (6, 8) and torch.isfinite(reference).all(), setting
        ts, vs = head.encode_texts(text), head.encode_videos(video)
        torch.testing.assert_close(head.score(ts, vs), reference, rtol=1e-4, atol=1e-5, msg=f"score {setting}")
        torch.testing.assert_close(head.score(ts, vs, text_chunk=4, video_chunk=3), reference, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(head.score_pairs(ts, vs, ti, vi).view(6, 8), reference, rtol=1e-4, atol=1e-5)
        idx, scores = head.rerank(ts, vs, 3)
        torch.testing.assert_close(scores, reference.gather(1, idx), rtol=1e-4, atol=1e-5)
        idx, scores = head.rerank_texts(ts, vs, 2)
        torch.testing.assert_close(scores, reference.T.gather(1, idx), rtol=1e-4, atol=1e-5)


def test_a_head_without_an_oracle_says_so() -> None:
    from toy_heads import BilinearHead

    class NoOracle(BilinearHead):
        reference_pair_scores = RetrievalHead.reference_pair_scores

    text, video = features(2, 2)
    with pytest.raises(NotImplementedError, match="NoOracle provides no reference_pair_scores"):
        NoOracle(D).reference_pair_scores(text, video)


def test_pairwise_scoring_blocks_are_bounded_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pairwise head that sets no chunk sizes is scored in blocks of at most PAIRWISE_CHUNK × PAIRWISE_CHUNK
    pairs, whatever the gallery; an indexable head scores each chunk of texts against the whole gallery."""
    from toy_heads import BilinearHead, MixtureHead

    seen: list[tuple[int, int]] = []
    for cls in (MixtureHead, BilinearHead):
        head = cls(D).eval()
        original = head.score_block
        monkeypatch.setattr(head, "score_block", lambda t, v, f=original: seen.append((len(t), len(v))) or f(t, v))
        text, video = features(PAIRWISE_CHUNK + 5, 2 * PAIRWISE_CHUNK + 3, seed=6)
        ts, vs = head.encode_texts(text), head.encode_videos(video)
        full = head.score(ts, vs)
        assert full.shape == (PAIRWISE_CHUNK + 5, 2 * PAIRWISE_CHUNK + 3)
        if head.indexable:
            assert {v for _, v in seen} == {2 * PAIRWISE_CHUNK + 3}
        else:
            assert max(t for t, _ in seen) <= PAIRWISE_CHUNK and max(v for _, v in seen) <= PAIRWISE_CHUNK
            torch.testing.assert_close(full, ts.emb @ vs.a.T + head.gamma * (ts.emb @ vs.b.T))
        seen.clear()


def test_contract_checkpoint_round_trip(name: str, tmp_path: Path) -> None:
    head = build(name, seed=0)
    text, video = features(6, 6)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    head.loss(text, video)["loss"].backward()
    optimizer.step()
    model = RetrievalModel(None, torch.nn.Identity(), head)
    save_checkpoint(tmp_path / "head.pt", model, optimizer)
    other = RetrievalModel(None, torch.nn.Identity(), build(name, seed=1))
    load_checkpoint(tmp_path / "head.pt", other)
    for a, b in ((model.head.eval(), other.head.eval()),):
        torch.testing.assert_close(
            a.score(a.encode_texts(text), a.encode_videos(video)),
            b.score(b.encode_texts(text), b.encode_videos(video)),
            rtol=0,
            atol=0,
        )


# --------------------------------------------------------------------------------------------- inference settings


def test_inference_setting_is_chosen_on_validation_stored_and_reported(tmp_path: Path) -> None:
    """A head with inference candidates: validation scores every candidate from one set of components and keeps
    the best by train.select_metric; the choice is saved with the checkpoint; test reports it and the baseline."""
    from toy_heads import MixtureHead

    from tvr.config import Config
    from tvr.eval.protocol import evaluate
    from tvr.eval.runner import EncodedSplit, evaluate_encoded

    torch.manual_seed(0)
    head = MixtureHead(D).eval()
    text, video = features(12, 12, seed=3)
    video.frames[:, 0] = video.frames[:, 0] + 2.0 * text.eot  # the first frame carries the caption: γ > 0 helps
    encoded = EncodedSplit(text, video, list(range(12)), [f"v{k}" for k in range(12)], "one_to_one")
    model = RetrievalModel(None, torch.nn.Identity(), head)
    cfg = Config()
    cfg.train.select_metric = "t2v/MnR"

    ts, vs = head.encode_texts(text), head.encode_videos(video)
    expected = {}
    for gamma in head.options.gammas:
        sim = ts.emb @ vs.a.T + gamma * (ts.emb @ vs.b.T)
        expected[gamma] = evaluate(sim, list(range(12)), "one_to_one")
    best = min(head.options.gammas, key=lambda g: (expected[g]["t2v"]["MnR"], head.options.gammas.index(g)))
    assert best != head.options.gammas[0]  # the data makes the choice matter

    metrics = evaluate_encoded(model, encoded, cfg, torch.device("cpu"), select_inference=True)
    assert head.inference_setting() == {"gamma": best} and metrics["info"]["inference_setting"] == {"gamma": best}
    assert [row["setting"]["gamma"] for row in metrics["info"]["inference_selection"]] == list(head.options.gammas)
    assert metrics["t2v"] == expected[best]["t2v"]
    assert metrics["t2v@gamma=0"] == expected[0.0]["t2v"] and metrics["v2t@gamma=0"] == expected[0.0]["v2t"]

    save_checkpoint(tmp_path / "best.pt", model)
    fresh = RetrievalModel(None, torch.nn.Identity(), MixtureHead(D))
    load_checkpoint(tmp_path / "best.pt", fresh)
    assert fresh.head.inference_setting() == {"gamma": best}
    test = evaluate_encoded(fresh, encoded, cfg, torch.device("cpu"))  # test: the stored setting, no re-selection
    assert test["t2v"] == expected[best]["t2v"] and "inference_selection" not in test["info"]


# --------------------------------------------------------------------------------------------- registry errors


def test_unknown_head_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"head.name = 'nope' is not a known head; valid names: \['clip4clip'"):
        registry.build_head(HeadConfig(name="nope"), D, LN_100)
    with pytest.raises(ValueError, match="dim"):
        registry.build_head(HeadConfig(), 0, LN_100)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("toy_heads:Missing", "has no attribute 'Missing'"),
        ("no_such_module_xyz:Head", "cannot import module 'no_such_module_xyz'"),
        ("toy_heads:NotAHead", "expected a RetrievalHead subclass"),
        ("toy_heads:", "must look like 'package.module:ClassName'"),
    ],
)
def test_import_path_errors_are_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        registry.head_class(spec)


def test_options_are_validated_by_the_heads_dataclass() -> None:
    opts = registry.head_options(TOY, {"proj_dim": 8, "pool": "max"})
    assert (opts.proj_dim, opts.pool) == (8, "max")
    with pytest.raises(ConfigError, match=r"head.options.pool = 'median': expected one of \['mean', 'max'\]"):
        registry.head_options(TOY, {"pool": "median"})
    with pytest.raises(ConfigError, match=r"head.options.proj_dim = 0: expected a number >= 1"):
        registry.head_options(TOY, {"proj_dim": 0})
    with pytest.raises(ConfigError, match=r"head.options.proj_dim: expected an integer"):
        registry.head_options(TOY, {"proj_dim": "wide"})
    with pytest.raises(ConfigError, match=r"head.options.scorer = 'approx': expected one of \['auto', 'fast'"):
        registry.head_options("gare", {"scorer": "approx"})


def test_register_head_decorator(monkeypatch: pytest.MonkeyPatch) -> None:
    from toy_heads import BilinearHead

    monkeypatch.setattr(registry, "_HEADS", dict(registry._HEADS))

    @registry.register_head("custom-bilinear")
    class Custom(BilinearHead):
        pass

    assert registry.head_class("custom-bilinear") is Custom and Custom.name == "custom-bilinear"
    with pytest.raises(ValueError, match="already registered"):

        @registry.register_head("custom-bilinear")
        class Other(BilinearHead):
            pass

    with pytest.raises(TypeError, match="RetrievalHead subclass"):
        registry.register_head("bad")(object)  # type: ignore[arg-type]


def test_heads_are_found_in_the_package_and_in_entry_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new module in tvr/methods registers without any list to edit; installed packages join through the
    ``tvr.heads`` entry-point group; a broken plug-in is reported, not fatal."""
    import importlib.metadata
    import sys

    import tvr.methods as methods_pkg

    plugin_dir = tmp_path / "extra_heads"
    plugin_dir.mkdir()
    (plugin_dir / "dropin.py").write_text(
        "from toy_heads import BilinearHead\n"
        "from tvr.models.heads.registry import register_head\n"
        "@register_head('dropin')\n"
        "class DropIn(BilinearHead):\n    pass\n"
    )
    monkeypatch.setattr(methods_pkg, "__path__", [*methods_pkg.__path__, str(plugin_dir)])
    monkeypatch.setattr(registry, "_HEADS", dict(registry._HEADS))
    monkeypatch.setattr(registry, "_DISCOVERED", False)
    monkeypatch.delitem(sys.modules, "tvr.methods.dropin", raising=False)

    good = importlib.metadata.EntryPoint("plugged", "toy_heads:BilinearHead", registry.ENTRY_POINT_GROUP)
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:Head", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [good, broken])
    names = registry.available_heads()
    assert {"dropin", "plugged", "clip4clip", "gare"} <= set(names) and "broken" not in names
    monkeypatch.delitem(sys.modules, "tvr.methods.dropin", raising=False)


# --------------------------------------------------------------------------------------------- through the CLI


def test_a_head_outside_the_package_trains_and_evaluates_from_the_cli(tmp_path: Path) -> None:
    import yaml
    from test_end_to_end import make_msrvtt

    from tvr.cli import app

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_msrvtt(tmp_path / "data")))
    runner = CliRunner()
    run = tmp_path / "run"
    args = [
        "--trust-code",  # the config names a head by import path, which imports that module
        "train",
        "--config",
        str(config),
        "--out",
        str(run),
        "--set",
        f"head.name={TOY}",
        "--set",
        "head.options.proj_dim=8",
        "--set",
        "train.max_steps=2",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    with trusting_code():
        saved = load_config(run / "config.yaml")
    assert saved.head.name == TOY and saved.head.options == {"proj_dim": 8, "pool": "mean"}
    metrics = json.loads((run / "test_best" / "metrics.json").read_text())
    assert metrics["head"] == TOY and metrics["indexable"] is True and metrics["scoring"] == "exhaustive"

    # the saved config re-evaluates the checkpoint
    ev = tmp_path / "eval"
    result = runner.invoke(
        app,
        [
            "--trust-code",
            "eval",
            "--config",
            str(run / "config.yaml"),
            "--checkpoint",
            str(run / "best.pt"),
            "--out",
            str(ev),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((ev / "metrics.json").read_text())["t2v"] == metrics["t2v"]

    # the checkpoint describes itself: no --config needed, and --set still overrides what it carries
    ev2 = tmp_path / "eval_self"
    result = runner.invoke(app, ["--trust-code", "eval", "--checkpoint", str(run / "best.pt"), "--out", str(ev2)])
    assert result.exit_code == 0, result.output
    assert json.loads((ev2 / "metrics.json").read_text())["t2v"] == metrics["t2v"]
    result = runner.invoke(
        app,
        [
            "--trust-code",
            "eval",
            "--checkpoint",
            str(run / "best.pt"),
            "--out",
            str(tmp_path / "ev3"),
            "--set",
            "head.options.pool=median",
        ],
    )
    assert result.exit_code == 2 and "head.options.pool = 'median'" in result.output

    # reusing the run folder needs --resume or --overwrite, and a bad option value fails at load
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--overwrite" in result.output
    fresh = tmp_path / "run2"
    bad = runner.invoke(app, [*args[:5], str(fresh), "--set", f"head.name={TOY}", "--set", "head.options.pool=median"])
    assert bad.exit_code == 2 and "head.options.pool = 'median'" in bad.output and "['mean', 'max']" in bad.output
    assert not fresh.exists()  # nothing was written


def _canary_head_module(folder: Path, marker: Path) -> str:
    """A module that records its import in ``marker`` (and defines a head): an import path to it."""
    (folder / "canary_heads.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nfrom toy_heads import BilinearHead\n"
    )
    return "canary_heads:BilinearHead"


def test_an_import_path_imports_code_only_when_the_user_trusts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config, a checkpoint's config or an index's model stamp is a file: it names a head by import path only
    with ``--trust-code`` (the module is never imported otherwise); registered names need no trust."""
    import sys

    import yaml
    from test_end_to_end import make_msrvtt

    from tvr.cli import app

    marker = tmp_path / "imported"
    spec = _canary_head_module(tmp_path, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "canary_heads", raising=False)
    with pytest.raises(ConfigError, match=r"head.name = 'canary_heads:BilinearHead' is an import path.*--trust-code"):
        config_from_dict({"head": {"name": spec}})
    with pytest.raises(ConfigError, match=r"the index's model config.head.name = 'canary_heads:Bil"):
        config_from_dict({"head": {"name": spec}}, where="the index's model config")
    assert config_from_dict({"head": {"name": "gare"}}).head.name == "gare"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_msrvtt(tmp_path / "data")))
    runner = CliRunner()
    train = ["train", "-c", str(config), "--out", str(tmp_path / "run"), "--set", f"head.name={spec}"]
    result = runner.invoke(app, [*train, "--set", "train.max_steps=1", "--no-test"])
    assert result.exit_code == 2 and "is an import path" in result.output and "--trust-code" in result.output
    result = runner.invoke(app, ["demo", "--quick", "--method", spec, "--out", str(tmp_path / "demo")])
    assert result.exit_code == 2 and "--method = 'canary_heads:BilinearHead' is an import path" in result.output
    assert not marker.exists() and "canary_heads" not in sys.modules and not (tmp_path / "run").exists()
    # trusted: it trains; the checkpoint it writes names the import path, so reading it back needs trust again
    result = runner.invoke(app, ["--trust-code", *train, "--set", "train.max_steps=1", "--no-test"])
    assert result.exit_code == 0, result.output
    assert marker.read_text() == "imported"
    result = runner.invoke(
        app, ["eval", "--checkpoint", str(tmp_path / "run" / "best.pt"), "--out", str(tmp_path / "e")]
    )
    assert result.exit_code == 2 and "is an import path" in result.output
    with trusting_code():
        assert config_from_dict({"head": {"name": spec}}).head.name == spec
    with pytest.raises(ConfigError):
        config_from_dict({"head": {"name": spec}})


def test_the_demo_runs_a_head_by_import_path(tmp_path: Path) -> None:
    """... and its tables name the inference setting validation chose and the chance level of the test split."""
    from tvr.cli import app

    result = CliRunner().invoke(
        app, ["--trust-code", "demo", "--quick", "--method", MIXTURE, "--out", str(tmp_path / "demo")]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "demo" / "run" / "test_best" / "metrics.json").read_text())
    assert metrics["head"] == MIXTURE
    gamma = metrics["inference_setting"]["gamma"]
    named = f"Inference setting: gamma = {gamma}, as stored in the checkpoint (chosen on the validation split)"
    chance = "Chance level (a random ranking): t2v R@1 5, R@5 25, R@10 50, MdR 10.5, MnR 10.5 (20 videos)"
    for text in (result.output, (tmp_path / "demo" / "run" / "test_best" / "metrics.md").read_text()):
        assert named in text and "rows `…@gamma=0`" in text and chance in text


def _invalid_value(f: dataclasses.Field) -> object | None:
    """A value the field's own metadata rules out (None when the field declares no rule)."""
    if f.metadata.get("choices"):
        return "not-a-choice"
    bounds = f.metadata.get("range")
    if bounds:
        ge, gt, le, lt = bounds
        if ge is not None:
            return ge - 1
        if gt is not None:
            return gt - 1
        if le is not None:
            return le + 1
        if lt is not None:
            return lt + 1
    return None


def test_constructor_checks_options_like_a_config(name: str) -> None:
    """The base constructor applies the config's rules to options given directly, the same for every head."""
    cls = registry.head_class(name)
    ruled = [(f, v) for f in dataclasses.fields(cls.Options) if (v := _invalid_value(f)) is not None]
    if not ruled:
        pytest.skip(f"{name} declares no choice/bounded option")
    for f, value in ruled:
        bad = dataclasses.replace(cls.Options(), **{f.name: value})
        with pytest.raises(ConfigError, match=rf"head\.options\.{f.name} = "):
            cls(D, bad)
