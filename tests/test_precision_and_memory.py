"""Mixed precision and memory switches: the autocast dtype each setting gives, bf16 and fp16 (with its grad scaler)
training steps on the CPU, a bit-exact fp16 resume that restores the scaler, gradient checkpointing of every
trainable backbone (the same gradients, fewer bytes kept for the backward), and the activation meter the memory
benchmark uses (exact bytes, the same on the meta device as on real tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tvr.config import Config, TrainConfig, config_from_dict
from tvr.data.tokenizer import build_tokenizer
from tvr.models.build import build_model
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.train.data import DatasetTrainData
from tvr.train.precision import autocast_dtype, grad_scaler
from tvr.train.trainer import Trainer
from tvr.utils.memory import SavedTensorMeter

TINY_CLIP = {
    "embed_dim": 32,
    "text_width": 32,
    "text_layers": 2,
    "text_heads": 2,
    "vision_width": 32,
    "vision_layers": 2,
    "vision_heads": 2,
    "image_size": 32,
    "patch_size": 16,
}
TINY_CLIP_EOT = 49407


# --------------------------------------------------------------------------------------------- mixed precision


def test_autocast_dtype_of_each_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert autocast_dtype(cpu, True, "auto") is None  # CPU runs stay float32 unless a dtype is named
    assert autocast_dtype(cpu, True, "bf16") is torch.bfloat16
    assert autocast_dtype(cpu, True, "fp16") is torch.float16
    assert autocast_dtype(cuda, False, "bf16") is None  # amp off wins
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_dtype(cuda, True, "auto") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype(cuda, True, "auto") is torch.float16  # e.g. V100, T4
    assert grad_scaler(cpu, torch.float16) is not None
    assert grad_scaler(cpu, torch.bfloat16) is None and grad_scaler(cpu, None) is None
    with pytest.raises(ValueError, match="train.amp_dtype"):
        config_from_dict({"train": {"amp_dtype": "fp8"}})


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 12, dim: int = 8) -> None:
        g = torch.Generator().manual_seed(1)
        self.frames = torch.randn(n, 3, dim, generator=g)
        self.text = self.frames.mean(1) + 0.3 * torch.randn(n, dim, generator=g)

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, k: int) -> dict:
        return {"text_eot": self.text[k], "frame_feats": self.frames[k], "video_mask": torch.ones(3)}


def _cached_model(head: str = "gare"):
    values = {
        "model": {
            "clip": "tiny",
            "temporal": "seqTransf",
            "temporal_layers": 1,
            "tiny": {**TINY_CLIP, "embed_dim": 8, "text_width": 8},
        },
        "head": {"name": head, "options": {"psi_dropout": 0.0}},
    }
    torch.manual_seed(0)
    return build_model(resolve_run(config_from_dict(values)), cached=True)


def _trainer(out: Path, amp_dtype: str, **train) -> Trainer:
    cfg = Config(
        train=TrainConfig(epochs=2, batch_size=4, lr=1e-2, device="cpu", log_every=1, amp_dtype=amp_dtype, **train)
    )
    return Trainer(_cached_model(), cfg, DatasetTrainData(_Pairs(), 4, seed=0), out)


@pytest.mark.parametrize("amp_dtype", ["bf16", "fp16"])
def test_autocast_training_on_cpu(tmp_path: Path, amp_dtype: str) -> None:
    trainer = _trainer(tmp_path / amp_dtype, amp_dtype, max_steps=2)
    seen: list[torch.dtype] = []
    trainer.model.head.psi.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    assert (trainer.scaler is not None) == (amp_dtype == "fp16")
    summary = trainer.fit()
    assert summary["steps"] == 2 and summary["final_loss"] == pytest.approx(summary["final_loss"])  # finite
    assert set(seen) == {torch.bfloat16 if amp_dtype == "bf16" else torch.float16}  # ψ ran in the low dtype
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # float32 master weights


def test_fp16_resume_restores_the_grad_scaler_bit_exactly(tmp_path: Path) -> None:
    straight = _trainer(tmp_path / "straight", "fp16")
    straight.fit()
    stopped = _trainer(tmp_path / "resumed", "fp16", max_steps=3)
    stopped.fit()
    saved = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)
    assert saved["scaler"]["scale"] == stopped.scaler.get_scale()
    resumed = _trainer(tmp_path / "resumed", "fp16")
    resumed.fit(resume=True)
    assert resumed.scaler.get_scale() == straight.scaler.get_scale()
    for key, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


# --------------------------------------------------------------------------------------------- activation memory


def test_saved_tensor_meter_is_exact_and_works_on_meta() -> None:
    def step(device: str) -> SavedTensorMeter:
        torch.manual_seed(0)
        lin = nn.Linear(16, 32).to(device)
        x = torch.randn(8, 16, device=device)
        with SavedTensorMeter(lin.parameters()) as meter:
            h = torch.relu(lin(x))  # saves x (8·16) and relu's output (8·32); the weight is excluded
            (h * h).sum()  # saves h twice: one storage
        return meter

    real, meta = step("cpu"), step("meta")
    assert real.bytes == meta.bytes == 4 * (8 * 16 + 8 * 32)
    assert real.count == meta.count == 2


# --------------------------------------------------------------------------------------------- checkpointing


def _raw_values(backbone: str) -> dict:
    model = {"clip": "tiny", "tiny": TINY_CLIP, "temporal": "meanP"}
    if backbone == "clipvip":
        model.update(backbone="clipvip", temporal="none")
    if backbone == "two_tower":
        model = {
            "backbone": "two_tower",
            "temporal": "meanP",
            "two_tower": {
                "text_model": "tiny",
                "image_model": "tiny",
                "embed_dim": 32,
                "bridge": "projection",
                "freeze_text": False,
                "freeze_image": False,
            },
        }
    return {
        "data": {"image_size": 32, "max_words": 12, "max_frames": 3},
        "model": model,
        "head": {"name": "clip4clip"},
        "train": {"device": "cpu"},
    }


@pytest.mark.parametrize("backbone", ["clip", "clipvip", "two_tower"])
def test_gradient_checkpointing_keeps_gradients_and_saves_memory(
    tmp_path: Path, backbone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TVR_CACHE_DIR", str(tmp_path / "cache"))
    values = _raw_values(backbone)
    cfg = resolve_config(config_from_dict(values))
    g = torch.Generator().manual_seed(0)
    if backbone == "two_tower":
        ids, mask = build_tokenizer(resolve_run(cfg).tokenizer, tmp_path)(
            ["a dog runs", "a cat sleeps on a mat", "two birds"], 12
        )
    else:  # CLIP ids: the end-of-text token is the largest id of a row
        ids, mask = torch.randint(1, 1000, (3, 12), generator=g), torch.ones(3, 12, dtype=torch.long)
        ids[:, -1] = TINY_CLIP_EOT
    batch = {
        "text_ids": ids,
        "text_mask": mask,
        "video": torch.randn(3, 3, 3, 32, 32, generator=g),
        "video_mask": torch.ones(3, 3, dtype=torch.long),
    }

    def step(checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
        values["model"]["gradient_checkpointing"] = checkpointing
        torch.manual_seed(0)
        model = build_model(resolve_run(config_from_dict(values))).train()
        with SavedTensorMeter(model.parameters()) as meter:
            loss = model(batch)["loss"]
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return grads, meter.bytes

    plain, plain_bytes = step(False)
    checkpointed, checkpointed_bytes = step(True)
    assert plain.keys() == checkpointed.keys() and any(n.startswith("backbone.") for n in plain)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    assert checkpointed_bytes < 0.6 * plain_bytes, (checkpointed_bytes, plain_bytes)


def test_fp16_clip_keeps_the_reference_precision_under_bf16_autocast() -> None:
    """A frozen CLIP in fp16 (the reference's convert_weights) encodes in fp16 even inside a bf16 training step."""
    values = _raw_values("clip")
    torch.manual_seed(0)
    backbone = build_model(resolve_run(config_from_dict(values))).backbone.eval()
    backbone.half_weights()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (2, 12), generator=g)
    ids[:, -1] = TINY_CLIP_EOT
    mask, pixels = torch.ones(2, 12, dtype=torch.long), torch.randn(2, 3, 3, 32, 32, generator=g)
    with torch.no_grad():
        plain = backbone.encode_text(ids, mask).eot, backbone.encode_frames(pixels)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = backbone.encode_text(ids, mask).eot, backbone.encode_frames(pixels)
    for a, b in zip(plain, inside, strict=True):
        assert torch.equal(a, b)  # fp16 arithmetic both times, not bf16
