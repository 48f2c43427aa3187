"""CLIP-ViP backbone: proxy-guided attention against an explicit masked full attention, the temporal-embedding
interpolation against a hand-computed one, the reduction to plain CLIP, shapes, checkpoint loading, and a tiny
end-to-end training run through the real pipeline."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.config import ModelConfig, config_from_dict, load_config
from tvr.models.backbones.clip.config import TinyClipConfig
from tvr.models.backbones.clip.modeling import ClipBackbone
from tvr.models.backbones.clipvip.config import ClipVipConfig
from tvr.models.backbones.clipvip.modeling import (
    CKPT_ADDED_CLS,
    CKPT_PREFIX,
    CKPT_TEMPORAL,
    TOKENS_FILE,
    ClipVipBackbone,
    ClipVipCheckpointError,
    interpolate_temporal,
    proxy_guided_layer,
)
from tvr.models.build import build_backbone, build_model
from tvr.models.run_spec import resolve_run
from tvr.utils.errors import UserError

TINY = TinyClipConfig(
    embed_dim=12,
    text_width=16,
    text_layers=1,
    text_heads=2,
    vision_width=16,
    vision_layers=2,
    vision_heads=2,
    image_size=16,
    patch_size=8,
    context_length=16,
    vocab_size=600,
)
L = (TINY.image_size // TINY.patch_size) ** 2  # patches per frame


def _model_cfg(**clipvip) -> ModelConfig:
    return ModelConfig(clip="tiny", tiny=TINY, backbone="clipvip", temporal="none", clipvip=ClipVipConfig(**clipvip))


def _backbone(
    num_proxies: int = 4, temporal_slots: int = 12, with_proxies: bool = False, seed: int = 0, randomise: bool = True
) -> ClipVipBackbone:
    """A float64 tiny CLIP-ViP; ``randomise`` gives the temporal table non-zero values so its placement matters."""
    torch.manual_seed(seed)
    bb = ClipVipBackbone.from_config(
        _model_cfg(num_proxies=num_proxies, temporal_slots=temporal_slots, proxy_projection=with_proxies)
    )
    if randomise:
        with torch.no_grad():
            bb.temporal_embedding.normal_(0.0, 0.5)
    return bb.double().eval()


def _pixels(n: int, t: int, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, t, 3, TINY.image_size, TINY.image_size, generator=g, dtype=torch.float64)


# --------------------------------------------------------------------------------------------- references


def _hand_interpolation(table: Tensor, size: int) -> Tensor:
    """Linear interpolation with half-pixel centres (what ``F.interpolate(mode="linear")`` documents), by hand."""
    slots = table.shape[0]
    rows = []
    for i in range(size):
        x = max((i + 0.5) * slots / size - 0.5, 0.0)
        lo = min(int(math.floor(x)), slots - 1)
        hi = min(lo + 1, slots - 1)
        w = x - lo
        rows.append((1.0 - w) * table[lo] + w * table[hi])
    return torch.stack(rows)


def _allowed(m: int, t: int, frame_mask: Tensor | None = None) -> Tensor:
    """The dense CLIP-ViP attention pattern [S, S] (or [N, S, S] with padded frames hidden from the proxies)."""
    s = m + t * L
    frame = torch.full((s,), -1)
    frame[m:] = torch.arange(t).repeat_interleave(L)
    allowed = torch.zeros(s, s, dtype=torch.bool)
    allowed[:m, :] = True  # proxies see everything
    allowed[m:, :m] = True  # patches see the proxies ...
    allowed[m:, m:] = frame[m:, None] == frame[None, m:]  # ... and their own frame
    if frame_mask is None:
        return allowed
    real = torch.cat(
        [torch.ones(frame_mask.shape[0], m, dtype=torch.bool), (frame_mask != 0).repeat_interleave(L, dim=1)], dim=1
    )  # [N, S]
    out = allowed.expand(frame_mask.shape[0], s, s).clone()
    out[:, :m, :] &= real[:, None, :]
    return out


def _reference_hidden(bb: ClipVipBackbone, pixels: Tensor, frame_mask: Tensor | None = None) -> Tensor:
    """Independent forward pass: tokens built by hand, full attention with the dense mask, explicit LN/MLP."""
    vision = bb.clip.vision_model
    emb = vision.embeddings
    n, t = pixels.shape[:2]
    m = bb.num_proxies
    w = bb.vision_width
    eps = vision.pre_layrnorm.eps
    p = TINY.patch_size
    g = TINY.image_size // p
    # patches by unfolding: patch (r, c) of frame f is pixels[:, f, :, r*p:(r+1)*p, c*p:(c+1)*p]
    blocks = pixels.reshape(n, t, 3, g, p, g, p).permute(0, 1, 3, 5, 2, 4, 6).reshape(n, t, g * g, 3 * p * p)
    patches = blocks @ emb.patch_embedding.weight.reshape(w, -1).t()  # [N, T, L, W]
    pos = emb.position_embedding.weight
    patches = patches + pos[1:] + _hand_interpolation(bb.temporal_embedding, t)[None, :, None, :]
    proxies = [emb.class_embedding] + ([] if bb.added_class_embedding is None else list(bb.added_class_embedding))
    proxies = torch.stack(proxies) + pos[0]
    x = torch.cat([proxies.expand(n, m, w), patches.reshape(n, t * L, w)], dim=1)
    x = F.layer_norm(x, (w,), vision.pre_layrnorm.weight, vision.pre_layrnorm.bias, eps)
    allowed = _allowed(m, t, frame_mask)
    allowed = allowed[None, None] if allowed.ndim == 2 else allowed[:, None]
    for layer in vision.encoder.layers:
        at = layer.self_attn
        heads, hd = at.num_heads, w // at.num_heads
        h = F.layer_norm(x, (w,), layer.layer_norm1.weight, layer.layer_norm1.bias, eps)

        def split(z: Tensor) -> Tensor:
            return z.reshape(n, -1, heads, hd).transpose(1, 2)  # noqa: B023

        q = split(h @ at.q_proj.weight.t() + at.q_proj.bias)
        k = split(h @ at.k_proj.weight.t() + at.k_proj.bias)
        v = split(h @ at.v_proj.weight.t() + at.v_proj.bias)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, -1, w)
        x = x + out @ at.out_proj.weight.t() + at.out_proj.bias
        h = F.layer_norm(x, (w,), layer.layer_norm2.weight, layer.layer_norm2.bias, eps)
        h = h @ layer.mlp.fc1.weight.t() + layer.mlp.fc1.bias
        h = h * torch.sigmoid(1.702 * h)  # quick-GELU
        x = x + h @ layer.mlp.fc2.weight.t() + layer.mlp.fc2.bias
    return x


# --------------------------------------------------------------------------------------------- attention


@pytest.mark.parametrize(("m", "t"), [(1, 1), (1, 3), (2, 1), (4, 5), (3, 12), (4, 32)])
def test_proxy_guided_tower_equals_masked_full_attention(m: int, t: int) -> None:
    bb = _backbone(num_proxies=m)
    pixels = _pixels(2, t)
    with torch.no_grad():
        ours = bb.video_hidden_states(pixels, torch.ones(2, t, dtype=torch.long))
        ref = _reference_hidden(bb, pixels)
    assert ours.shape == (2, m + t * L, bb.vision_width)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_attention_dropout_acts_in_training_only() -> None:
    """With attention dropout > 0 (a tiny config with dropout on, unlike the pretrained 0): eval mode is
    deterministic and equal to the tower without dropout; training mode drops attention weights."""
    bb = _backbone(num_proxies=2)
    pixels = _pixels(2, 3)
    mask = torch.ones(2, 3, dtype=torch.long)
    with torch.no_grad():
        clean = bb.video_hidden_states(pixels, mask)
        for layer in bb.clip.vision_model.encoder.layers:
            layer.self_attn.dropout = 0.5
        torch.manual_seed(0)
        first = bb.video_hidden_states(pixels, mask)
        torch.manual_seed(1)
        second = bb.video_hidden_states(pixels, mask)
        bb.train()
        torch.manual_seed(0)
        dropped = bb.video_hidden_states(pixels, mask)
    torch.testing.assert_close(first, clean, rtol=0, atol=0)
    torch.testing.assert_close(second, clean, rtol=0, atol=0)
    assert not torch.allclose(dropped, clean)


def test_the_mask_matters() -> None:
    """Guard against a vacuous comparison: the HF layer's own full attention gives a different result, and with a
    single frame (where the pattern is full attention) the same one."""
    bb = _backbone(num_proxies=2)
    layer = bb.clip.vision_model.encoder.layers[0]
    with torch.no_grad():
        for t, differs in ((3, True), (1, False)):
            x = bb.clip.vision_model.pre_layrnorm(bb.video_tokens(_pixels(1, t)))
            dense = layer(x, None)
            guided = proxy_guided_layer(layer, x, 2, t)
            assert ((guided - dense).abs().max() > 1e-3) == differs


def test_padded_frames_are_hidden_from_the_proxies() -> None:
    bb = _backbone(num_proxies=3, with_proxies=True)
    pixels = _pixels(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 1]])
    with torch.no_grad():
        ours = bb.video_hidden_states(pixels, mask)
        ref = _reference_hidden(bb, pixels, mask)
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
        # what sits in a padded slot cannot change any output
        noisy = pixels.clone()
        noisy[1, 3:] = 100.0 * torch.randn_like(noisy[1, 3:])
        a, b = bb.encode_video(pixels, mask), bb.encode_video(noisy, mask)
    torch.testing.assert_close(a.frames, b.frames, rtol=0, atol=0)
    torch.testing.assert_close(a.proxies, b.proxies, rtol=0, atol=0)
    assert a.frame_mask.tolist() == [[1], [1], [1]]


def test_padding_equals_encoding_the_real_frames_alone_when_time_is_flat() -> None:
    """With a constant temporal table (the interpolation length then does not matter) a padded clip gives
    exactly what its real frames alone give."""
    bb = _backbone(num_proxies=4, with_proxies=True)
    with torch.no_grad():
        bb.temporal_embedding.copy_(torch.randn(bb.vision_width, dtype=torch.float64).expand(12, -1))
        pixels = _pixels(1, 6)
        padded = bb.encode_video(pixels, torch.tensor([[1, 1, 1, 1, 0, 0]]))
        alone = bb.encode_video(pixels[:, :4], torch.ones(1, 4, dtype=torch.long))
    torch.testing.assert_close(padded.frames, alone.frames, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(padded.proxies, alone.proxies, rtol=1e-10, atol=1e-10)


def test_all_padding_video_keeps_only_its_proxies_and_reports_mask_zero() -> None:
    bb = _backbone(num_proxies=2)
    with torch.no_grad():
        out = bb.encode_video(_pixels(2, 3), torch.tensor([[0, 0, 0], [1, 1, 1]]))
    assert out.frame_mask.tolist() == [[0], [1]]
    assert torch.isfinite(out.frames).all()


# --------------------------------------------------------------------------------------------- temporal embedding


@pytest.mark.parametrize("size", [32, 8, 5, 1])
def test_temporal_interpolation_matches_hand_computed_linear(size: int) -> None:
    table = torch.randn(12, 7, dtype=torch.float64)
    torch.testing.assert_close(
        interpolate_temporal(table, size), _hand_interpolation(table, size), rtol=1e-12, atol=1e-12
    )


def test_temporal_interpolation_values_by_hand() -> None:
    """Spot values worked out on paper for a ramp table: row k = k."""
    table = torch.arange(12, dtype=torch.float64)[:, None]
    up = interpolate_temporal(table, 32)[:, 0]
    # output i samples x = (i + 0.5)·12/32 − 0.5, clamped at 0: i=0 → 0, i=1 → 0.0625, i=16 → 5.6875, i=31 → 11
    assert up[0].item() == 0.0 and up[1].item() == pytest.approx(0.0625)
    assert up[16].item() == pytest.approx(5.6875) and up[31].item() == 11.0
    down = interpolate_temporal(table, 8)[:, 0]
    # x = (i + 0.5)·1.5 − 0.5 = 1.5 i + 0.25
    torch.testing.assert_close(down, 1.5 * torch.arange(8, dtype=torch.float64) + 0.25)


def test_twelve_frames_use_the_table_unchanged() -> None:
    bb = _backbone()
    assert bb.temporal_embedding_for(12) is bb.temporal_embedding
    assert bb.temporal_embedding_for(32).shape == (32, bb.vision_width)
    with pytest.raises(ValueError, match="at least one frame"):
        bb.temporal_embedding_for(0)


# --------------------------------------------------------------------------------------------- reductions, shapes


def test_one_proxy_one_frame_no_time_is_plain_clip_image_encoding() -> None:
    bb = _backbone(num_proxies=1, with_proxies=True, randomise=False)
    assert bb.added_class_embedding is None and torch.count_nonzero(bb.temporal_embedding) == 0
    pixels = _pixels(3, 1)
    with torch.no_grad():
        video = bb.encode_video(pixels, torch.ones(3, 1, dtype=torch.long))
        clip_frames = ClipBackbone(bb.clip).encode_frames(pixels)
        cls_hidden = bb.clip.vision_model(pixel_values=pixels[:, 0]).last_hidden_state[:, 0]
    torch.testing.assert_close(video.frames, clip_frames.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        video.proxies[:, 0], bb.visual_projection_patch(cls_hidden).float(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("with_proxies", [False, True])
def test_output_shapes_dtypes_and_parameters(with_proxies: bool) -> None:
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=4, proxy_projection=with_proxies)).eval()
    pixels = _pixels(3, 5).float()
    mask = torch.ones(3, 5, dtype=torch.long)
    with torch.no_grad():
        out = bb.encode_video(pixels, mask)
    assert out.frames.shape == (3, 1, TINY.embed_dim) and out.frames.dtype == torch.float32
    assert out.frame_mask.shape == (3, 1) and out.frame_mask.dtype == torch.long
    own = {name for name, _ in bb.named_parameters() if not name.startswith("clip.")}
    if with_proxies:
        assert out.proxies.shape == (3, 4, TINY.embed_dim) and out.proxies.dtype == torch.float32
        assert own == {"added_class_embedding", "temporal_embedding", "visual_projection_patch.weight"}
        assert bb.visual_projection_patch.bias is None
    else:
        assert out.proxies is None
        assert own == {"added_class_embedding", "temporal_embedding"}
    assert bb.added_class_embedding.shape == (3, TINY.vision_width)
    assert bb.temporal_embedding.shape == (12, TINY.vision_width)
    # CLIP-ViP's initialisation: temporal table zero, added proxies from torch.randn (unit variance, not CLIP's)
    assert torch.count_nonzero(bb.temporal_embedding) == 0
    empty = bb.encode_video(pixels[:0], mask[:0])
    assert empty.frames.shape == (0, 1, TINY.embed_dim)


def test_every_new_parameter_gets_a_gradient() -> None:
    """DDP needs every parameter used: the new tokens and the proxy projection all receive gradients."""
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=3, proxy_projection=True))
    out = bb.encode_video(_pixels(2, 4).float(), torch.ones(2, 4, dtype=torch.long))
    (out.frames.sum() + out.proxies.sum()).backward()
    for name in ("added_class_embedding", "temporal_embedding"):
        assert getattr(bb, name).grad is not None and getattr(bb, name).grad.abs().sum() > 0, name
    assert bb.visual_projection_patch.weight.grad.abs().sum() > 0


def test_frame_chunk_encodes_the_same_videos() -> None:
    bb = _backbone(num_proxies=2, with_proxies=True)
    pixels = _pixels(5, 3)
    mask = torch.ones(5, 3, dtype=torch.long)
    with torch.no_grad():
        whole = bb.encode_video(pixels, mask)
        bb.frame_chunk = 7  # two videos (6 frames) per pass
        chunked = bb.encode_video(pixels, mask)
    torch.testing.assert_close(chunked.frames, whole.frames, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.proxies, whole.proxies, rtol=1e-12, atol=1e-12)


def test_input_errors() -> None:
    bb = _backbone()
    with pytest.raises(ValueError, match=r"pixels \[N, F, 3, S, S\]"):
        bb.encode_video(_pixels(1, 2)[0], torch.ones(1, 2))
    with pytest.raises(ValueError, match="frame_mask"):
        bb.encode_video(_pixels(1, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="image_size"):
        bb.encode_video(torch.zeros(1, 2, 3, 24, 24, dtype=torch.float64), torch.ones(1, 2))
    with pytest.raises(NotImplementedError, match="encode_video"):
        bb.encode_frames(_pixels(1, 2))
    with pytest.raises(ValueError, match="num_proxies"):
        ClipVipBackbone(bb.clip, num_proxies=0)
    with pytest.raises(ValueError, match="temporal_slots"):
        ClipVipBackbone(bb.clip, temporal_slots=0)


def test_fp16_weights_give_float32_outputs_close_to_fp32() -> None:
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=2, proxy_projection=True)).eval()
    pixels = _pixels(2, 3).float()
    mask = torch.ones(2, 3, dtype=torch.long)
    with torch.no_grad():
        ref = bb.encode_video(pixels, mask)
        bb.half_weights()
        assert bb.temporal_embedding.dtype == torch.float16 and bb.visual_projection_patch.weight.dtype == torch.float16
        assert bb.clip.logit_scale.dtype == torch.float32
        half = bb.encode_video(pixels, mask)
    assert half.frames.dtype == torch.float32 and half.proxies.dtype == torch.float32
    torch.testing.assert_close(half.frames, ref.frames, rtol=0.05, atol=0.05)


# --------------------------------------------------------------------------------------------- checkpoints


def _synthetic_clipvip_file(
    bb: ClipVipBackbone,
    path: Path,
    dtype: torch.dtype = torch.float16,
    extra: dict[str, Tensor] | None = None,
    slots: int = 12,
) -> dict[str, Tensor]:
    """A file in the documented ``pretrain_clipvip_base_32.pt`` layout, every tensor distinct random values."""
    g = torch.Generator().manual_seed(123)
    state: dict[str, Tensor] = {}
    for key, value in bb.clip.state_dict().items():
        state[CKPT_PREFIX + key] = torch.randn(value.shape, generator=g).to(dtype)
    width = bb.vision_width
    state[CKPT_PREFIX + CKPT_ADDED_CLS] = torch.randn(bb.num_proxies - 1, width, generator=g).to(dtype)
    state[CKPT_PREFIX + CKPT_TEMPORAL] = torch.randn(1, slots, width, generator=g).to(dtype)
    # transformers 4.x saved these buffers; they carry no weights
    state[CKPT_PREFIX + "vision_model.embeddings.position_ids"] = torch.arange(L + 1)[None]
    state[CKPT_PREFIX + "text_model.embeddings.position_ids"] = torch.arange(TINY.context_length)[None]
    state.update(extra or {})
    torch.save(state, path)
    return state


def test_post_pretrained_checkpoint_lands_where_it_should(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=4))
    path = tmp_path / "pretrain_clipvip_base_32.pt"
    state = _synthetic_clipvip_file(bb, path, extra={"text_proxy.leader.weight": torch.ones(3)})
    report = bb.load_clipvip_checkpoint(path)

    for key, value in bb.clip.state_dict().items():
        torch.testing.assert_close(value, state[CKPT_PREFIX + key].float(), rtol=0, atol=0, msg=key)
    torch.testing.assert_close(
        bb.added_class_embedding.data, state[CKPT_PREFIX + CKPT_ADDED_CLS].float(), rtol=0, atol=0
    )
    torch.testing.assert_close(
        bb.temporal_embedding.data, state[CKPT_PREFIX + CKPT_TEMPORAL][0].float(), rtol=0, atol=0
    )
    assert bb.logit_scale_value == pytest.approx(float(state[CKPT_PREFIX + "logit_scale"]))
    assert report.missing == []
    assert report.unexpected == ["text_proxy.leader.weight"]
    assert sorted(report.ignored) == sorted(k for k in state if k.endswith("position_ids"))
    assert len(report.mapped) == len(state) - 3
    assert report.mapped[CKPT_PREFIX + CKPT_ADDED_CLS] == "added_class_embedding"
    assert report.mapped[CKPT_PREFIX + CKPT_TEMPORAL] == "temporal_embedding"
    assert report.mapped[CKPT_PREFIX + "vision_model.pre_layrnorm.weight"] == "clip.vision_model.pre_layrnorm.weight"
    assert set(report.mapped.values()) == set(bb.state_dict())
    assert bb.load_report is report
    assert "1 unexpected" in report.summary() and "text_proxy.leader.weight" in str(report)


def test_checkpoint_variants_prefixes_wrappers_and_tp_projection(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=4, proxy_projection=True))
    plain = _synthetic_clipvip_file(bb, tmp_path / "a.pt", dtype=torch.float32)
    report = bb.load_clipvip_checkpoint(tmp_path / "a.pt")
    assert report.missing == ["visual_projection_patch.weight"]  # not in a CLIP-ViP file: keeps its init
    # a DDP-saved TP checkpoint: module. prefix, restorer wrapper, and the proxy projection present
    proj = torch.randn(TINY.embed_dim, TINY.vision_width)
    wrapped = {"model_state_dict": {"module." + k: v for k, v in plain.items()}}
    wrapped["model_state_dict"]["module.clipmodel.visual_projection_patch.weight"] = proj
    torch.save(wrapped, tmp_path / "b.pt")
    report = bb.load_clipvip_checkpoint(tmp_path / "b.pt")
    assert report.missing == [] and report.unexpected == []
    torch.testing.assert_close(bb.visual_projection_patch.weight.data, proj, rtol=0, atol=0)
    # the same TP file into a backbone without the projection: reported as unexpected, not an error
    no_proj = ClipVipBackbone.from_config(_model_cfg(num_proxies=4))
    report = no_proj.load_clipvip_checkpoint(tmp_path / "b.pt")
    assert report.unexpected == ["module.clipmodel.visual_projection_patch.weight"]


def test_checkpoint_errors_leave_weights_untouched(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bb = ClipVipBackbone.from_config(_model_cfg(num_proxies=4, temporal_slots=12))
    before = {k: v.clone() for k, v in bb.state_dict().items()}
    _synthetic_clipvip_file(bb, tmp_path / "slots8.pt", slots=8)
    with pytest.raises(ValueError, match=r"temporal_embedding has shape \(1, 8, 16\).*temporal_slots"):
        bb.load_clipvip_checkpoint(tmp_path / "slots8.pt")
    for key, value in bb.state_dict().items():
        assert torch.equal(value, before[key]), key
    torch.save({"backbone.clip.logit_scale": torch.tensor(1.0)}, tmp_path / "tvr_run.pt")
    with pytest.raises(ValueError, match="no tensor matches"):
        bb.load_clipvip_checkpoint(tmp_path / "tvr_run.pt")
    with pytest.raises(FileNotFoundError, match="model.clipvip.checkpoint"):
        bb.load_clipvip_checkpoint(tmp_path / "absent.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ClipVipCheckpointError, match="not a torch checkpoint: a text file"):
        bb.load_clipvip_checkpoint(tmp_path / "junk.pt")
    assert issubclass(ClipVipCheckpointError, UserError)  # one line from the CLI, no traceback


def test_config_checkpoint_and_save_roundtrips(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = ClipVipBackbone.from_config(_model_cfg(num_proxies=3, proxy_projection=True))
    with torch.no_grad():
        source.temporal_embedding.normal_()
    file = source.save_clipvip_checkpoint(tmp_path / "ckpt" / "clipvip.pt")
    torch.manual_seed(99)  # a different random init underneath: everything must come from the file
    loaded = ClipVipBackbone.from_config(_model_cfg(num_proxies=3, proxy_projection=True, checkpoint=str(file)))
    assert loaded.load_report is not None and loaded.load_report.missing == []
    pixels = _pixels(2, 4).float()
    mask = torch.ones(2, 4, dtype=torch.long)
    with torch.no_grad():
        a, b = source.eval().encode_video(pixels, mask), loaded.eval().encode_video(pixels, mask)
    torch.testing.assert_close(b.frames, a.frames, rtol=0, atol=0)
    torch.testing.assert_close(b.proxies, a.proxies, rtol=0, atol=0)

    folder = source.save_pretrained(tmp_path / "hf")
    assert (folder / "config.json").is_file() and (folder / TOKENS_FILE).is_file()
    cfg = _model_cfg(num_proxies=3, proxy_projection=True, checkpoint=str(folder / TOKENS_FILE))
    again = ClipVipBackbone.from_config(dataclasses.replace(cfg, clip=str(folder)))
    assert sorted(again.load_report.mapped.values()) == [
        "added_class_embedding",
        "temporal_embedding",
        "visual_projection_patch.weight",
    ]
    with torch.no_grad():
        c = again.eval().encode_video(pixels, mask)
    torch.testing.assert_close(c.frames, a.frames, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------- config, build


def test_build_picks_the_backbone_and_checks_the_temporal_module() -> None:
    from tvr.config import Config

    cfg = Config(model=_model_cfg())
    model = build_model(resolve_run(cfg))
    assert isinstance(model.backbone, ClipVipBackbone) and model.temporal.kind == "none"
    assert type(build_backbone(resolve_run(Config(model=ModelConfig(clip="tiny", tiny=TINY))))) is ClipBackbone
    meanp = dataclasses.replace(_model_cfg(), temporal="meanP")
    assert isinstance(build_backbone(resolve_run(Config(model=meanp))), ClipVipBackbone)
    with pytest.raises(ValueError, match="model.temporal='seqTransf' with model.backbone=clipvip"):
        build_backbone(resolve_run(Config(model=dataclasses.replace(_model_cfg(), temporal="seqTransf"))))
    with pytest.raises(ValueError, match="model.backbone='vip'"):
        resolve_run(Config(model=dataclasses.replace(_model_cfg(), backbone="vip")))


PRESETS = Path(__file__).resolve().parents[1] / "tvr" / "models" / "backbones" / "clipvip" / "presets"


@pytest.mark.parametrize(
    ("name", "frames", "words", "lr", "captions"),
    [
        ("msrvtt", 12, 50, 1e-6, "one_per_video"),
        ("msrvtt_b16", 12, 50, 1e-6, "one_per_video"),
        ("didemo", 12, 50, 2e-6, "all_pairs"),
        ("activitynet", 32, 70, 2e-6, "all_pairs"),
    ],
)
def test_presets_load_with_the_clipvip_recipe(name: str, frames: int, words: int, lr: float, captions: str) -> None:
    from tvr.pipeline import resolve_config

    raw = load_config(PRESETS / f"{name}.yaml")
    assert raw.data.sampling is None and raw.data.image_size is None  # left to the backbone
    cfg = resolve_config(raw)  # offline: the hub id's input size is known without its files
    assert cfg.model.backbone == "clipvip" and cfg.model.temporal == "none"
    assert cfg.model.clipvip.num_proxies == 4 and cfg.model.clipvip.temporal_slots == 12
    assert cfg.data.sampling == "clipvip" and cfg.data.caption_sampling == captions
    assert (cfg.data.max_frames, cfg.data.max_words, cfg.data.image_size) == (frames, words, 224)
    assert cfg.head.name == "clip4clip" and cfg.head.options.video_pool == "mean"
    assert cfg.head.logit_scale_max == pytest.approx(math.log(200))
    assert cfg.train.lr == pytest.approx(lr) and cfg.train.backbone_lr_coef == 1.0
    assert cfg.train.betas == (0.9, 0.98) and cfg.train.weight_decay == pytest.approx(0.2)
    assert cfg.train.warmup == pytest.approx(0.01) and cfg.train.schedule == "warmup_cosine"
    assert ("16" in cfg.model.clip) == (name == "msrvtt_b16")


# --------------------------------------------------------------------------------------------- end to end


def test_tiny_clipvip_trains_end_to_end_on_generated_videos(tmp_path: Path) -> None:
    from annotation_fixtures import write_msrvtt
    from videos import write_test_video

    from tvr.pipeline import run_train
    from tvr.train.checkpoint import load_checkpoint

    root = tmp_path / "data"
    vids = [f"video{k}" for k in range(10)]
    write_msrvtt(root, vids, captions_per_video=3, test_ids=vids[7:])
    (root / "videos").mkdir()
    for k, vid in enumerate(vids):
        write_test_video(root / "videos" / f"{vid}.mp4", num_frames=6 + k % 3, fps=4, size=(32, 32))
    from test_end_to_end import TINY as END_TO_END_TINY  # image_size 32: the videos' crop

    values = {
        "data": {
            "dataset": "msrvtt",
            "annotations": str(root),
            "video_dir": str(root / "videos"),
            "max_words": 16,
            "max_frames": 3,
            "image_size": 32,
            "val_fraction": 0.25,
            "sampling": "clipvip",
            "caption_sampling": "one_per_video",
        },
        "model": {
            "clip": "tiny",
            "tiny": END_TO_END_TINY,
            "backbone": "clipvip",
            "temporal": "none",
            "clipvip": {"num_proxies": 4, "temporal_slots": 12},
        },
        "head": {"name": "clip4clip", "clip4clip": {"video_pool": "mean"}, "logit_scale_max": math.log(200)},
        "train": {
            "epochs": 2,
            "batch_size": 2,
            "lr": 1e-3,
            "backbone_lr_coef": 1.0,
            "warmup": 0.01,
            "log_every": 1,
            "device": "cpu",
            "num_threads": 1,
        },
        "eval": {"batch_size": 8},
    }
    cfg = config_from_dict(values)
    torch.manual_seed(0)
    init = build_model(resolve_run(cfg)).backbone.temporal_embedding.detach().clone()
    out = tmp_path / "run"
    summary = run_train(cfg, out)

    # 7 training videos minus the held-out validation share, one caption each: batches of 2 per epoch
    assert summary["steps"] >= 2
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [rec["loss"] for rec in log if "loss" in rec]
    assert losses and all(math.isfinite(x) for x in losses)
    metrics = json.loads((out / "test_best" / "metrics.json").read_text())
    assert set(metrics["t2v"]) == {"R1", "R5", "R10", "MdR", "MnR"}
    model = build_model(resolve_run(cfg))
    load_checkpoint(out / "last.pt", model)
    assert isinstance(model.backbone, ClipVipBackbone)
    assert not torch.equal(model.backbone.temporal_embedding.detach(), init)  # the new tokens trained
