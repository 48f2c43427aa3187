"""CLIP4Clip / GARE release checkpoints → tvr: synthetic state dicts in the documented key layout (tiny sizes), every
tensor checked at its destination, and the imported model's scores against a forward pass written directly on the
raw release tensors (fused in_proj attention through ``F.multi_head_attention_forward``, as nn.MultiheadAttention)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import Tensor
from typer.testing import CliRunner

from tvr.cli import app
from tvr.config import Config, config_from_dict
from tvr.models.import_checkpoint import (
    CheckpointImportError,
    detect_layout,
    import_release_checkpoint,
    load_release_state_dict,
)
from tvr.models.run_spec import resolve_run
from tvr.types import TextFeatures, VideoFeatures

D, TEXT_LAYERS, HEADS, V_WIDTH, V_LAYERS, V_HEADS, PATCH, IMAGE, CTX, VOCAB = 32, 2, 2, 48, 2, 3, 8, 16, 77, 49408
TEMPORAL_LAYERS = 2
EOT = VOCAB - 1


def _cfg(head: str = "clip4clip", temporal: str = "seqTransf", layers: int = TEMPORAL_LAYERS) -> Config:
    return config_from_dict(
        {
            "model": {
                "clip": "tiny",
                "temporal": temporal,
                "temporal_layers": layers,
                "tiny": {
                    "embed_dim": D,
                    "text_width": D,
                    "text_layers": TEXT_LAYERS,
                    "text_heads": HEADS,
                    "vision_width": V_WIDTH,
                    "vision_layers": V_LAYERS,
                    "vision_heads": V_HEADS,
                    "image_size": IMAGE,
                    "patch_size": PATCH,
                    "context_length": CTX,
                    "vocab_size": VOCAB,
                },
            },
            "head": {"name": head, "options": {"psi_dropout": 0.3, "pool_temperature": 3.0} if head == "gare" else {}},
        }
    )


def _block(sd: dict[str, Tensor], prefix: str, width: int, g: torch.Generator) -> None:
    def r(*shape: int, scale: float = 0.1) -> Tensor:
        return scale * torch.randn(*shape, generator=g)

    sd.update(
        {
            prefix + "attn.in_proj_weight": r(3 * width, width),
            prefix + "attn.in_proj_bias": r(3 * width),
            prefix + "attn.out_proj.weight": r(width, width),
            prefix + "attn.out_proj.bias": r(width),
            prefix + "ln_1.weight": 1 + r(width),
            prefix + "ln_1.bias": r(width),
            prefix + "mlp.c_fc.weight": r(4 * width, width),
            prefix + "mlp.c_fc.bias": r(4 * width),
            prefix + "mlp.c_proj.weight": r(width, 4 * width),
            prefix + "mlp.c_proj.bias": r(width),
            prefix + "ln_2.weight": 1 + r(width),
            prefix + "ln_2.bias": r(width),
        }
    )


def clip4clip_release(seed: int = 0, temporal: bool = True) -> dict[str, Tensor]:
    """A CLIP4Clip ``pytorch_model.bin`` state dict (sim_header seqTransf, or meanP without ``temporal``)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.1) -> Tensor:
        return scale * torch.randn(*shape, generator=g)

    grid = IMAGE // PATCH
    sd = {
        "clip.positional_embedding": r(CTX, D),
        "clip.text_projection": r(D, D, scale=D**-0.5),
        "clip.logit_scale": torch.tensor(math.log(80.0)),
        "clip.token_embedding.weight": r(VOCAB, D),
        "clip.ln_final.weight": 1 + r(D),
        "clip.ln_final.bias": r(D),
        "clip.visual.class_embedding": r(V_WIDTH),
        "clip.visual.positional_embedding": r(grid * grid + 1, V_WIDTH),
        "clip.visual.proj": r(V_WIDTH, D, scale=V_WIDTH**-0.5),
        "clip.visual.conv1.weight": r(V_WIDTH, 3, PATCH, PATCH),
        "clip.visual.ln_pre.weight": 1 + r(V_WIDTH),
        "clip.visual.ln_pre.bias": r(V_WIDTH),
        "clip.visual.ln_post.weight": 1 + r(V_WIDTH),
        "clip.visual.ln_post.bias": r(V_WIDTH),
    }
    for i in range(TEXT_LAYERS):
        _block(sd, f"clip.transformer.resblocks.{i}.", D, g)
    for i in range(V_LAYERS):
        _block(sd, f"clip.visual.transformer.resblocks.{i}.", V_WIDTH, g)
    if temporal:
        sd["frame_position_embeddings.weight"] = r(CTX, D)
        for i in range(TEMPORAL_LAYERS):
            _block(sd, f"transformerClip.resblocks.{i}.", D, g)
    return sd


def gare_release(seed: int = 0) -> dict[str, Tensor]:
    """A GARE ``best.pth``: CLIP4Clip's keys plus ψ under ``agent.psi.`` and its alias ``psi.``, plus the unused
    ``weight_fc``, ``log_std_proj``, ``linear2`` and ``mlp``."""
    sd = clip4clip_release(seed)
    g = torch.Generator().manual_seed(seed + 100)

    def r(*shape: int, scale: float = 0.2) -> Tensor:
        return scale * torch.randn(*shape, generator=g)

    psi: dict[str, Tensor] = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        psi[f"layers.0.cross_attn.{name}.weight"], psi[f"layers.0.cross_attn.{name}.bias"] = r(D, D), r(D)
    for name in ("linear1", "linear2"):
        psi[f"layers.0.{name}.weight"], psi[f"layers.0.{name}.bias"] = r(D, D), r(D)
    psi["layers.0.mlp.0.weight"], psi["layers.0.mlp.0.bias"] = r(4 * D, D), r(4 * D)
    psi["layers.0.mlp.2.weight"], psi["layers.0.mlp.2.bias"] = r(D, 4 * D), r(D)
    for name in ("layer_norm1", "layer_norm2", "layer_norm3"):
        psi[f"layers.0.{name}.weight"], psi[f"layers.0.{name}.bias"] = 1 + r(D), r(D)
    for name in ("mean_proj", "log_std_proj"):
        psi[f"{name}.weight"], psi[f"{name}.bias"] = r(D, D), r(D)
    for prefix in ("agent.psi.", "psi."):
        sd.update({prefix + k: v for k, v in psi.items()})
    width = D // 1  # GARE's weight_fc: Linear(2w, 4w), ReLU, Linear(4w, 1), unused
    sd.update(
        {
            "weight_fc.0.weight": r(4 * width, 2 * width),
            "weight_fc.0.bias": r(4 * width),
            "weight_fc.2.weight": r(1, 4 * width),
            "weight_fc.2.bias": r(1),
        }
    )
    return sd


# --------------------------------------------------------------------------------- reference forward (raw keys)


def _ln(x: Tensor, sd: dict[str, Tensor], key: str) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), sd[key + ".weight"], sd[key + ".bias"], eps=1e-5)


def _ref_block(x: Tensor, sd: dict[str, Tensor], p: str, heads: int, mask: Tensor | None) -> Tensor:
    """OpenAI ResidualAttentionBlock on x [L, N, W] (sequence first, as nn.MultiheadAttention)."""
    h = _ln(x, sd, p + "ln_1")
    attn, _ = F.multi_head_attention_forward(
        h,
        h,
        h,
        x.shape[-1],
        heads,
        sd[p + "attn.in_proj_weight"],
        sd[p + "attn.in_proj_bias"],
        None,
        None,
        False,
        0.0,
        sd[p + "attn.out_proj.weight"],
        sd[p + "attn.out_proj.bias"],
        training=False,
        need_weights=False,
        attn_mask=mask,
    )
    x = x + attn
    h = F.linear(_ln(x, sd, p + "ln_2"), sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"])
    return x + F.linear(h * torch.sigmoid(1.702 * h), sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"])


def ref_text(sd: dict[str, Tensor], ids: Tensor) -> Tensor:
    """CLIP4Clip ``encode_text``: causal mask, ln_final, text_projection, row at argmax(ids)."""
    n, length = ids.shape
    x = (sd["clip.token_embedding.weight"][ids] + sd["clip.positional_embedding"][:length]).transpose(0, 1)
    causal = torch.full((length, length), float("-inf")).triu(1)
    for i in range(TEXT_LAYERS):
        x = _ref_block(x, sd, f"clip.transformer.resblocks.{i}.", HEADS, causal)
    x = _ln(x.transpose(0, 1), sd, "clip.ln_final") @ sd["clip.text_projection"]
    return x[torch.arange(n), ids.argmax(dim=-1)]


def ref_image(sd: dict[str, Tensor], pixels: Tensor) -> Tensor:
    """CLIP4Clip ``encode_image``: patches, class token, positions, ln_pre, blocks, ln_post(CLS) @ proj."""
    x = F.conv2d(pixels, sd["clip.visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    cls = sd["clip.visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = _ln(torch.cat([cls, x], dim=1) + sd["clip.visual.positional_embedding"], sd, "clip.visual.ln_pre")
    x = x.transpose(0, 1)
    for i in range(V_LAYERS):
        x = _ref_block(x, sd, f"clip.visual.transformer.resblocks.{i}.", V_HEADS, None)
    return _ln(x[0], sd, "clip.visual.ln_post") @ sd["clip.visual.proj"]


def ref_seq_transf(sd: dict[str, Tensor], frames: Tensor, mask: Tensor) -> Tensor:
    """seqTransf: + frame positions, blocks with the additive key mask (1 − m)·(−1e6) of *each* video, + input."""
    n, f, _ = frames.shape
    x = frames + sd["frame_position_embeddings.weight"][:f]
    additive = ((1.0 - mask.float())[:, None, :] * -1e6).expand(n, f, f).repeat_interleave(HEADS, dim=0)
    x = x.transpose(0, 1)
    for i in range(TEMPORAL_LAYERS):
        x = _ref_block(x, sd, f"transformerClip.resblocks.{i}.", HEADS, additive)
    return x.transpose(0, 1) + frames


def ref_clip4clip_scores(t: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    frames = F.normalize(v, dim=-1) * mask[..., None]
    pooled = F.normalize(frames.sum(1) / mask.sum(1, keepdim=True).clamp_min(1), dim=-1)
    return F.normalize(t, dim=-1) @ pooled.t()


def ref_gare_scores(sd: dict[str, Tensor], t: Tensor, v: Tensor, mask: Tensor, temp: float = 3.0) -> Tensor:
    """GARE's released score, pair by pair, from the raw ψ keys (spec §3.1-3.2)."""
    p = "agent.psi."

    def lin(x: Tensor, name: str) -> Tensor:
        return F.linear(x, sd[p + name + ".weight"], sd[p + name + ".bias"])

    out = torch.empty(t.shape[0], v.shape[0], dtype=t.dtype)
    for i in range(t.shape[0]):
        for j in range(v.shape[0]):
            q = _ln(v[j].mean(0) - t[i], sd, p + "layers.0.layer_norm1")
            c = _ln(v[j], sd, p + "layers.0.layer_norm1")
            logits = lin(c, "layers.0.cross_attn.k_proj") @ lin(q, "layers.0.cross_attn.q_proj") / math.sqrt(D)
            a = torch.softmax(logits, dim=0)
            o = lin(a @ lin(c, "layers.0.cross_attn.v_proj"), "layers.0.cross_attn.out_proj")
            h = _ln(o, sd, p + "layers.0.layer_norm2")
            h = _ln(h + lin(h, "layers.0.linear1"), sd, p + "layers.0.layer_norm3")
            delta = lin(h, "mean_proj")
            w = torch.softmax(v[j] @ t[i] / temp, dim=0) * mask[j]
            out[i, j] = F.cosine_similarity(t[i] + delta, w @ v[j], dim=0)
    return out


def _inputs(g: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    ids = torch.zeros(3, 10, dtype=torch.long)
    mask_t = torch.zeros(3, 10, dtype=torch.long)
    for row, n in enumerate((4, 7, 10)):
        ids[row, 0] = VOCAB - 2
        ids[row, 1 : n - 1] = torch.randint(1, VOCAB - 2, (n - 2,), generator=g)
        ids[row, n - 1] = EOT
        mask_t[row, :n] = 1
    pixels = torch.randn(4, 5, 3, IMAGE, IMAGE, generator=g)
    mask_v = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    return ids, mask_t, pixels, mask_v


# ------------------------------------------------------------------------------------------------------ tests


def test_every_clip4clip_tensor_lands_where_documented() -> None:
    sd = clip4clip_release(seed=1)
    model, report = import_release_checkpoint_from_dict(sd, _cfg())
    assert report.complete and report.layout == "clip4clip" and not report.ignored
    own = model.state_dict()
    # every model tensor was filled: spot-check the families against the raw tensors, q/k/v split included
    w = sd["transformerClip.resblocks.1.attn.in_proj_weight"]
    b = sd["transformerClip.resblocks.1.attn.in_proj_bias"]
    for k, name in enumerate("qkv"):
        assert torch.equal(own[f"temporal.blocks.1.self_attn.{name}_proj.weight"], w[k * D : (k + 1) * D])
        assert torch.equal(own[f"temporal.blocks.1.self_attn.{name}_proj.bias"], b[k * D : (k + 1) * D])
    pairs = {
        "temporal.frame_position_embeddings.weight": "frame_position_embeddings.weight",
        "temporal.blocks.0.layer_norm1.weight": "transformerClip.resblocks.0.ln_1.weight",
        "temporal.blocks.0.layer_norm2.bias": "transformerClip.resblocks.0.ln_2.bias",
        "temporal.blocks.0.mlp.fc1.weight": "transformerClip.resblocks.0.mlp.c_fc.weight",
        "temporal.blocks.0.mlp.fc2.bias": "transformerClip.resblocks.0.mlp.c_proj.bias",
        "temporal.blocks.0.self_attn.out_proj.weight": "transformerClip.resblocks.0.attn.out_proj.weight",
        "backbone.clip.text_model.encoder.layers.1.mlp.fc1.weight": "clip.transformer.resblocks.1.mlp.c_fc.weight",
        "backbone.clip.vision_model.embeddings.patch_embedding.weight": "clip.visual.conv1.weight",
        "backbone.clip.logit_scale": "clip.logit_scale",
        "head.logit_scale": "clip.logit_scale",
    }
    for dst, src in pairs.items():
        assert torch.equal(own[dst], sd[src]), dst
    assert torch.equal(own["backbone.clip.text_projection.weight"], sd["clip.text_projection"].t())
    q = sd["clip.visual.transformer.resblocks.0.attn.in_proj_weight"][:V_WIDTH]
    assert torch.equal(own["backbone.clip.vision_model.encoder.layers.0.self_attn.q_proj.weight"], q)
    mapped = dict((dst, src) for src, dst in report.mapped)
    assert mapped["temporal.blocks.1.self_attn.k_proj.weight"] == "transformerClip.resblocks.1.attn.in_proj_weight[k]"
    assert set(mapped) == set(own)  # nothing left at its random init
    used = {src.split("[")[0].removesuffix(" (transposed)") for src in mapped.values()}
    assert used == set(sd)  # and every release tensor was used


def test_imported_clip4clip_scores_equal_the_reference_forward() -> None:
    sd = clip4clip_release(seed=2)
    model, _ = import_release_checkpoint_from_dict(sd, _cfg())
    model.eval()
    ids, mask_t, pixels, mask_v = _inputs(torch.Generator().manual_seed(3))
    with torch.no_grad():
        text = model.text_features({"text_ids": ids, "text_mask": mask_t})
        video = model.video_features({"video": pixels, "video_mask": mask_v})
        scores = model.head.score(model.head.encode_texts(text), model.head.encode_videos(video))
        t_ref = ref_text(sd, ids)
        frames_ref = ref_image(sd, pixels.flatten(0, 1)).view(4, 5, D)
        v_ref = ref_seq_transf(sd, frames_ref, mask_v)
    torch.testing.assert_close(text.eot, t_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(video.frames, v_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(scores, ref_clip4clip_scores(t_ref, v_ref, mask_v.float()), rtol=1e-4, atol=1e-5)


def test_meanp_release_into_a_meanp_model() -> None:
    sd = clip4clip_release(seed=4, temporal=False)
    model, report = import_release_checkpoint_from_dict(sd, _cfg(temporal="meanP"))
    assert report.complete
    with pytest.raises(CheckpointImportError, match="temporal"):
        import_release_checkpoint_from_dict(sd, _cfg(temporal="seqTransf"))
    with pytest.raises(CheckpointImportError, match="transformerClip"):
        import_release_checkpoint_from_dict(clip4clip_release(seed=4), _cfg(temporal="meanP"))
    with pytest.raises(CheckpointImportError, match="transformerClip.resblocks.1"):
        import_release_checkpoint_from_dict(clip4clip_release(seed=4), _cfg(layers=1))


def test_gare_release_maps_psi_and_scores_like_the_reference() -> None:
    sd = gare_release(seed=5)
    assert detect_layout(sd) == "gare"
    model, report = import_release_checkpoint_from_dict(sd, _cfg(head="gare"))
    assert report.complete and report.layout == "gare"
    psi = model.head.psi.state_dict()
    assert torch.equal(psi["ln_in.weight"], sd["agent.psi.layers.0.layer_norm1.weight"])
    assert torch.equal(psi["ln_attn.bias"], sd["agent.psi.layers.0.layer_norm2.bias"])
    assert torch.equal(psi["ln_out.weight"], sd["agent.psi.layers.0.layer_norm3.weight"])
    assert torch.equal(psi["linear.weight"], sd["agent.psi.layers.0.linear1.weight"])
    assert torch.equal(psi["delta_proj.bias"], sd["agent.psi.mean_proj.bias"])
    for name in ("q", "k", "v", "out"):
        assert torch.equal(psi[f"{name}_proj.weight"], sd[f"agent.psi.layers.0.cross_attn.{name}_proj.weight"])
    ignored = set(report.ignored)
    assert {k for k in sd if k.startswith("psi.")} <= ignored  # the alias
    assert {
        "agent.psi.log_std_proj.weight",
        "agent.psi.layers.0.linear2.bias",
        "agent.psi.layers.0.mlp.2.weight",
        "weight_fc.0.weight",
    } <= ignored
    assert not report.unexpected and not report.missing

    model.eval()
    g = torch.Generator().manual_seed(6)
    t = torch.randn(5, D, generator=g)
    v = torch.randn(4, 6, D, generator=g)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]])
    head = model.head
    with torch.no_grad():
        ours = head.score(head.encode_texts(TextFeatures(t)), head.encode_videos(VideoFeatures(v, mask)))
        sd64 = {k: v.double() for k, v in sd.items() if k.startswith("agent.psi.")}
        want = ref_gare_scores(sd64, t.double(), v.double(), mask.double()).float()
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)

    with pytest.raises(CheckpointImportError, match="no ψ"):
        import_release_checkpoint_from_dict(clip4clip_release(seed=5), _cfg(head="gare"))
    with pytest.raises(CheckpointImportError, match="not gare"):
        import_release_checkpoint_from_dict(sd, _cfg(head="clip4clip"))
    _, partial = import_release_checkpoint_from_dict(clip4clip_release(seed=5), _cfg(head="gare"), partial=True)
    assert partial.missing and all(k.startswith("head.psi.") for k in partial.missing)


def test_psi_alias_must_agree_and_shapes_must_fit() -> None:
    sd = gare_release(seed=7)
    sd["psi.mean_proj.bias"] = sd["psi.mean_proj.bias"] + 1
    with pytest.raises(CheckpointImportError, match="differs"):
        import_release_checkpoint_from_dict(sd, _cfg(head="gare"))
    cfg = _cfg()
    cfg.model.tiny["vision_width"] = 60  # a loaded config holds the section as its mapping until resolved
    with pytest.raises(CheckpointImportError, match="model.clip"):
        import_release_checkpoint_from_dict(clip4clip_release(seed=7), cfg)


def test_file_reading_unwraps_and_rejects(tmp_path: Path) -> None:
    sd = clip4clip_release(seed=8)
    path = tmp_path / "pytorch_model.bin"
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, path)
    loaded = load_release_state_dict(path)
    assert set(loaded) == set(sd) and all(torch.equal(loaded[k], sd[k]) for k in sd)
    (tmp_path / "notes.txt").write_text("this is not a checkpoint\n")
    with pytest.raises(CheckpointImportError, match="not a readable PyTorch checkpoint"):
        load_release_state_dict(tmp_path / "notes.txt")
    with pytest.raises(CheckpointImportError, match="not found"):
        load_release_state_dict(tmp_path / "missing.bin")
    torch.save({"foo.weight": torch.zeros(2)}, tmp_path / "other.bin")
    with pytest.raises(CheckpointImportError, match="clip"):
        detect_layout(load_release_state_dict(tmp_path / "other.bin"))


def test_cli_writes_a_checkpoint_eval_loads(tmp_path: Path) -> None:
    from tvr.pipeline import load_model_for_eval

    sd = gare_release(seed=9)
    half = {k: (v.half() if k.startswith("clip.") and v.is_floating_point() else v) for k, v in sd.items()}
    src = tmp_path / "best.pth"
    torch.save({"module." + k: v for k, v in half.items()}, src)
    cfg = _cfg(head="gare")
    from tvr.config import config_to_dict

    config_path = tmp_path / "gare.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    out = tmp_path / "imported" / "best.pt"
    result = CliRunner().invoke(
        app,
        [
            "import-checkpoint",
            str(src),
            "-c",
            str(config_path),
            "-o",
            str(out),
            "--report",
            str(tmp_path / "report.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["layout"] == "gare" and not report["missing"] and not report["unexpected"]
    model = load_model_for_eval(cfg, out)
    own = model.state_dict()
    assert torch.equal(own["backbone.clip.visual_projection.weight"], sd["clip.visual.proj"].half().float().t())
    assert torch.equal(own["head.psi.q_proj.weight"], sd["agent.psi.layers.0.cross_attn.q_proj.weight"])

    bad = CliRunner().invoke(
        app,
        [
            "import-checkpoint",
            str(src),
            "-c",
            str(config_path),
            "-o",
            str(tmp_path / "x.pt"),
            "--set",
            "head.name=clip4clip",
        ],
    )
    assert bad.exit_code == 2 and "not gare" in bad.output and not (tmp_path / "x.pt").exists()


def import_release_checkpoint_from_dict(sd: dict[str, Tensor], cfg: Config, partial: bool = False):
    """import_release_checkpoint on an in-memory state dict (saved to a temporary file first)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ckpt.bin"
        torch.save(sd, path)
        return import_release_checkpoint(path, resolve_run(cfg), partial=partial)
