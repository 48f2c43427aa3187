"""Resize / crop / normalise numerics and geometry of the CLIP preprocessing (no torchvision)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tvr.data.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    center_crop,
    clip_preprocess,
    normalize,
    resize_short_side,
    short_side_size,
    square_resize,
)


def test_normalisation_constants_are_clips() -> None:
    assert CLIP_MEAN == (0.48145466, 0.4578275, 0.40821073)
    assert CLIP_STD == (0.26862954, 0.26130258, 0.27577711)
    mean_image = torch.tensor(CLIP_MEAN).view(3, 1, 1).expand(3, 4, 5)
    assert torch.allclose(normalize(mean_image), torch.zeros(3, 4, 5), atol=1e-7)
    ones = normalize(torch.ones(2, 3, 2, 2))
    for c in range(3):
        assert torch.allclose(ones[:, c], torch.full((2, 2, 2), (1 - CLIP_MEAN[c]) / CLIP_STD[c]))


def test_short_side_size_follows_torchvision_truncation() -> None:
    assert short_side_size(48, 64, 32) == (32, 42)  # int(32 * 64 / 48) = 42
    assert short_side_size(448, 252, 224) == (398, 224)  # int(224 * 448 / 252) = 398
    assert short_side_size(240, 320, 224) == (224, 298)  # 298.67 truncated
    assert short_side_size(50, 50, 7) == (7, 7)


def test_resize_keeps_constant_images_constant_and_dtype() -> None:
    x = torch.full((2, 3, 48, 64), 77, dtype=torch.uint8)
    x[:, 1] = 200
    out = resize_short_side(x, 20)
    assert out.shape == (2, 3, 20, 26) and out.dtype == torch.uint8
    assert (out[:, 0] == 77).all() and (out[:, 1] == 200).all()
    up = square_resize(x.float(), 100)
    assert up.shape == (2, 3, 100, 100) and up.dtype == torch.float32
    assert torch.allclose(up[:, 1], torch.full_like(up[:, 1], 200.0), atol=1e-3)


def test_resize_clamps_bicubic_overshoot() -> None:
    x = torch.zeros(1, 3, 16, 16)
    x[..., :, 8:] = 255.0  # hard edge: bicubic rings beyond [0, 255]
    raw = torch.nn.functional.interpolate(x, size=(40, 40), mode="bicubic", antialias=True)
    assert raw.min() < 0.0 and raw.max() > 255.0  # the case under test
    out = square_resize(x, 40)
    assert out.min() >= 0.0 and out.max() <= 255.0
    assert out[..., 0].max() == 0.0 and out[..., -1].min() == pytest.approx(255.0)


def test_resize_is_a_noop_at_target_size() -> None:
    x = torch.randint(0, 256, (1, 3, 24, 30), dtype=torch.uint8)
    assert torch.equal(resize_short_side(x, 24), x)


def test_resize_matches_pil_bicubic_closely() -> None:
    image_module = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    big = np.kron(base, np.ones((5, 5, 1), dtype=np.uint8))  # 60 x 80, blocky
    ours = resize_short_side(torch.from_numpy(big).permute(2, 0, 1)[None], 24)[0].permute(1, 2, 0).numpy()
    theirs = np.asarray(image_module.fromarray(big).resize((32, 24), image_module.BICUBIC))
    assert ours.shape == theirs.shape == (24, 32, 3)
    assert np.abs(ours.astype(int) - theirs.astype(int)).mean() < 2.0


def test_center_crop_geometry() -> None:
    x = torch.arange(9 * 12).view(1, 1, 9, 12)
    # top = round((9 - 4) / 2) = round(2.5) = 2 (ties to even), left = round((12 - 4) / 2) = 4
    torch.testing.assert_close(center_crop(x, 4), x[..., 2:6, 4:8])
    y = torch.arange(10 * 7).view(1, 10, 7)
    torch.testing.assert_close(center_crop(y, 5), y[..., 2:7, 1:6])  # round(2.5) = 2, round(1.0) = 1


@pytest.mark.parametrize(
    "height,width,size,top,left",
    [
        # offsets that end in .5 with an odd integer part: round() goes up where floor (// 2) goes down
        (227, 231, 224, 2, 4),  # top = round(3 / 2) = round(1.5) = 2, left = round(7 / 2) = round(3.5) = 4
        (7, 11, 4, 2, 4),  # the same offsets (1.5, 3.5) on a small image
        (231, 227, 224, 4, 2),  # and with the axes swapped
        (229, 230, 224, 2, 3),  # round(2.5) = 2 (ties to even, like floor), round(3.0) = 3
    ],
)
def test_center_crop_rounds_half_offsets_like_torchvision(height, width, size, top, left) -> None:
    """torchvision's CenterCrop places the crop at top = int(round((H - size) / 2)), left = int(round((W - size) / 2))
    with Python's round (ties to even); the expected offsets above are worked out by hand from that formula."""
    x = torch.arange(2 * height * width, dtype=torch.int64).view(2, 1, height, width)
    out = center_crop(x, size)
    assert out.shape == (2, 1, size, size)
    # every pixel value encodes its (row, column), so the first one pins the placement on both axes
    assert out[0, 0, 0, 0].item() == top * width + left
    assert torch.equal(out, x[..., top : top + size, left : left + size])


def test_clip_preprocess_short_side_crop_uses_the_rounded_offset() -> None:
    """Through the CLIP4Clip pipeline: a frame whose short side already equals ``size`` is only cropped, and the
    long side's 3-pixel excess is split round(1.5) = 2 before, 1 after."""
    size, long_side = 16, 19
    columns = np.arange(long_side, dtype=np.uint8) * 10  # column k has value 10·k in every channel
    frames = np.broadcast_to(columns[None, None, :, None], (1, size, long_side, 3)).copy()
    out = clip_preprocess(frames, size, mode="short_side")
    x = torch.from_numpy(frames).permute(0, 3, 1, 2)[..., :, 2 : 2 + size]
    torch.testing.assert_close(out, normalize(x.float() / 255.0), rtol=0, atol=0)
    portrait = np.ascontiguousarray(frames.transpose(0, 2, 1, 3))  # 19 × 16: the crop moves to the rows
    out = clip_preprocess(portrait, size, mode="short_side")
    torch.testing.assert_close(out, normalize(x.transpose(-1, -2).float() / 255.0), rtol=0, atol=0)


def test_center_crop_pads_small_images_with_zeros() -> None:
    x = torch.ones(1, 3, 2, 3)
    out = center_crop(x, 4)
    assert out.shape == (1, 3, 4, 4)
    assert out.sum() == 3 * 6
    # torchvision padding: left = 1 // 2 = 0, top = 2 // 2 = 1
    assert (out[..., 1:3, 0:3] == 1).all() and out[..., 0, :].sum() == 0 and out[..., :, 3].sum() == 0


def test_clip_preprocess_constant_colour_maps_to_its_normalised_value() -> None:
    frames = np.zeros((2, 30, 40, 3), dtype=np.uint8)
    frames[0] = (255, 0, 0)
    frames[1] = (10, 128, 250)
    out = clip_preprocess(frames, 16)
    assert out.shape == (2, 3, 16, 16) and out.dtype == torch.float32
    for k in range(2):
        for c in range(3):
            expected = (frames[k, 0, 0, c] / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]
            assert torch.allclose(out[k, c], torch.full((16, 16), float(expected)), atol=1e-5)


def test_clip_preprocess_modes_and_augment_hook() -> None:
    frames = np.zeros((1, 30, 20, 3), dtype=np.uint8)  # portrait: 30 high, 20 wide
    frames[0, :, :, 0] = np.arange(30, dtype=np.uint8)[:, None] * 8  # red grows downward
    seen = {}

    def fake_augment(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        seen["shape"], seen["dtype"], seen["generator"] = tuple(x.shape), x.dtype, generator
        return x

    g = torch.Generator().manual_seed(0)
    short = clip_preprocess(frames, 10, mode="short_side", augment=fake_augment, generator=g)
    # augmentation sees the resized, uncropped uint8 frames: short side 10 → 15 x 10
    assert seen == {"shape": (1, 3, 15, 10), "dtype": torch.uint8, "generator": g}
    square = clip_preprocess(frames, 10, mode="square")
    assert short.shape == square.shape == (1, 3, 10, 10)
    # the crop drops the top and bottom rows; the square resize keeps the whole height
    red = lambda t: t[0, 0, :, 5] * CLIP_STD[0] + CLIP_MEAN[0]  # noqa: E731
    assert red(square)[0] < red(short)[0] and red(square)[-1] > red(short)[-1]
    with pytest.raises(ValueError, match="resize mode"):
        clip_preprocess(frames, 10, mode="letterbox")
    with pytest.raises(ValueError, match="uint8"):
        clip_preprocess(frames.astype(np.float32), 10)
