"""CLIP-ViP video backbone (spec §4.1) on the weights of a Hugging Face ``CLIPModel``.

CLIP-ViP turns CLIP's image tower into a video tower without new layers; see docs/methods/clipvip.md for the whole
story (initialisation, checkpoint layout, deviations). In short, for a clip of T frames with L patches each:

* **Tokens.** M *video proxies* = CLIP's class embedding plus M − 1 learned vectors (``added_class_embedding``),
  all with CLIP's CLS position embedding; then the T·L patch tokens, each with its spatial position embedding plus a
  learned temporal embedding of its frame (``temporal_embedding``: ``temporal_slots`` rows, linearly interpolated
  to T when T differs). Sequence: ``[M proxies, frame 0's L patches, …, frame T−1's L patches]``.
* **Proxy-guided attention** in every layer: a patch of frame n attends to the M proxies and to frame n's L
  patches; a proxy attends to all M + T·L tokens. Everything else is CLIP's pre-LN block, with the HF layer's own
  q/k/v/out projections, LayerNorms and MLP, so any CLIP (or CLIP-ViP) checkpoint applies unchanged.
* **Outputs.** The video feature is ``visual_projection(post_layernorm(proxy 0))`` (one pooled slot, so
  ``VideoFeatures.frames`` is [N, 1, D]). With ``with_proxies`` the M proxies' last hidden states, *without*
  post-LN, go through TV-ProxyNet's bias-free ``visual_projection_patch`` into ``VideoFeatures.proxies`` [N, M, D].

The attention is never a dense (M + T·L)² masked attention: the frame-local part is one batched attention of
N·T queries blocks of L patches over their M + L keys, and the proxy part one attention of the M proxies over all
tokens (both through ``F.scaled_dot_product_attention``). ``tests/test_clipvip.py`` checks both against an explicit
masked full attention.

Frame padding. CLIP-ViP sampling always yields F real frames, so the reference has no frame mask. If a mask with
zeros ever arrives, the padded frames' patch tokens are removed from the proxies' keys (their own frame-local
attention still runs, but no real token ever reads them), so the outputs equal those of the real frames alone,
except that the temporal embedding is interpolated for the padded length F. A video whose frames are all padding
keeps only its proxies; its output ``frame_mask`` is 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import CLIPModel

from tvr.config import ModelConfig
from tvr.models.backbones.clip.files import save_clip_atomic
from tvr.models.backbones.clip.modeling import ClipBackbone, clip_from_config
from tvr.types import VideoFeatures
from tvr.utils.errors import UserError
from tvr.utils.io import describe_file_start
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, load_torch_file

log = logging.getLogger(__name__)

#: prefix of every CLIP weight in a CLIP-ViP checkpoint (the ``VidCLIP.clipmodel`` attribute)
CKPT_PREFIX = "clipmodel."
#: CLIP-ViP names of its new tensors, relative to ``CKPT_PREFIX``
CKPT_ADDED_CLS = "vision_model.embeddings.added_cls"
CKPT_TEMPORAL = "vision_model.embeddings.temporal_embedding"
#: TV-ProxyNet's proxy projection (only in TP checkpoints)
CKPT_PROXY_PROJ = "visual_projection_patch.weight"
#: file written next to the HF folder by :meth:`ClipVipBackbone.save_pretrained`
TOKENS_FILE = "clipvip_tokens.pt"


# --------------------------------------------------------------------------------------------- attention


def proxy_guided_attention(
    attn: nn.Module, hidden: Tensor, num_proxies: int, num_frames: int, proxy_key_mask: Tensor | None = None
) -> Tensor:
    """One HF ``CLIPAttention`` (its q/k/v/out projections, scale and dropout) with CLIP-ViP's attention pattern.

    hidden: [N, M + T·L, W], the layer's LayerNorm-ed input. ``proxy_key_mask`` (bool, broadcastable to
    [N, 1, 1, M + T·L], True = may be attended) restricts only the proxies' keys (frame padding). Returns [N, S, W].
    """
    n, s, w = hidden.shape
    m, t = num_proxies, num_frames
    patches = (s - m) // t
    if m < 1 or t < 1 or m + t * patches != s:
        raise ValueError(f"proxy_guided_attention: {s} tokens is not {m} proxies + {t} frames × L patches")
    heads, dim = attn.num_heads, attn.head_dim
    drop = attn.dropout if attn.training else 0.0
    q = attn.q_proj(hidden).view(n, s, heads, dim)
    k = attn.k_proj(hidden).view(n, s, heads, dim)
    v = attn.v_proj(hidden).view(n, s, heads, dim)

    # proxies: M queries over all M + T·L keys
    out_proxy = F.scaled_dot_product_attention(
        q[:, :m].transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=proxy_key_mask,
        dropout_p=drop,
        scale=attn.scale,
    )  # [N, H, M, d]

    # patches: N·T independent blocks, each L queries over [the M proxies, its own L patches]
    def frame_local(x: Tensor) -> Tensor:
        proxies = x[:, :m].unsqueeze(1).expand(n, t, m, heads, dim)
        own = x[:, m:].reshape(n, t, patches, heads, dim)
        return torch.cat([proxies, own], dim=2).reshape(n * t, m + patches, heads, dim).transpose(1, 2)

    q_frames = q[:, m:].reshape(n * t, patches, heads, dim).transpose(1, 2)
    out_frames = F.scaled_dot_product_attention(
        q_frames, frame_local(k), frame_local(v), dropout_p=drop, scale=attn.scale
    )  # [N·T, H, L, d]

    out = torch.cat(
        [out_proxy.transpose(1, 2).reshape(n, m, w), out_frames.transpose(1, 2).reshape(n, t * patches, w)], dim=1
    )
    return attn.out_proj(out)


def proxy_guided_layer(
    layer: nn.Module, x: Tensor, num_proxies: int, num_frames: int, proxy_key_mask: Tensor | None = None
) -> Tensor:
    """A HF ``CLIPEncoderLayer`` (pre-LN, quick-GELU MLP) run with proxy-guided attention."""
    x = x + proxy_guided_attention(layer.self_attn, layer.layer_norm1(x), num_proxies, num_frames, proxy_key_mask)
    return x + layer.mlp(layer.layer_norm2(x))


def interpolate_temporal(table: Tensor, num_frames: int) -> Tensor:
    """[S, W] slots → [T, W]: CLIP-ViP's ``F.interpolate(mode="linear")`` (align_corners=False); T = S is the
    identity. Half-precision tables are interpolated in float32 (not every device has a half linear kernel)."""
    slots = table.shape[0]
    if num_frames == slots:
        return table
    work = table if table.dtype in (torch.float32, torch.float64) else table.float()
    out = F.interpolate(work.t().unsqueeze(0), size=num_frames, mode="linear", align_corners=False)
    return out[0].t().to(table.dtype)


# --------------------------------------------------------------------------------------------- checkpoint report


@dataclasses.dataclass
class CheckpointReport:
    """What loading a CLIP-ViP checkpoint did.

    mapped:     checkpoint key → the backbone ``state_dict`` key it was copied into.
    missing:    backbone keys the file did not provide (they keep their current values: CLIP weights from
                ``model.clip``, new tokens from CLIP-ViP's initialisation).
    unexpected: checkpoint keys that match nothing here (e.g. TV-ProxyNet's ``text_proxy.*``).
    ignored:    bookkeeping buffers (``position_ids``) that carry no weights.
    """

    path: str
    mapped: dict[str, str]
    missing: list[str]
    unexpected: list[str]
    ignored: list[str]

    def summary(self) -> str:
        return (
            f"CLIP-ViP checkpoint {self.path}: {len(self.mapped)} tensors mapped, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.ignored)} ignored"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.missing:
            lines.append("  missing (kept as initialised): " + ", ".join(self.missing))
        if self.unexpected:
            lines.append("  unexpected (not loaded): " + ", ".join(self.unexpected))
        return "\n".join(lines)


class ClipVipCheckpointError(UserError, ValueError):
    """``model.clipvip.checkpoint`` is not a CLIP-ViP checkpoint, or does not fit the backbone."""


def _unwrap_state(obj: Any, where: str) -> dict[str, Tensor]:
    """The flat tensor dict of a checkpoint: CLIP-ViP's ``ModelSaver`` file, or its restorer's ``model_state_dict``."""
    if isinstance(obj, dict):
        for key in ("model_state_dict", "state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise ClipVipCheckpointError(
            f"model.clipvip.checkpoint {where}: holds a {type(obj).__name__}"
            f"{' (empty)' if isinstance(obj, dict) else ''}; expected a CLIP-ViP state dict "
            "(a mapping of tensor names to tensors)"
        )
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ClipVipCheckpointError(
            f"model.clipvip.checkpoint {where}: expected a flat mapping of names to tensors; "
            f"entry {bad[0]!r} is not one"
        )
    return obj


# --------------------------------------------------------------------------------------------- backbone


class ClipVipBackbone(ClipBackbone):
    """CLIP text tower (unchanged) + CLIP-ViP video tower on the same ``CLIPModel`` (spec §4.1).

    ``num_proxies`` = M (CLIP's class token + M − 1 learned), ``temporal_slots`` = rows of the learned temporal
    embedding, ``with_proxies`` adds ``visual_projection_patch`` and fills ``VideoFeatures.proxies``. ``frame_chunk``
    (> 0) bounds the frames per vision pass by encoding ``max(1, frame_chunk // F)`` videos at a time.

    New parameters are initialised as CLIP-ViP's code leaves them when it builds its model from a CLIP checkpoint:
    ``added_class_embedding`` ~ N(0, 1) (``torch.randn``; HF's ``_init_weights`` never touches it),
    ``temporal_embedding`` = 0, ``visual_projection_patch`` = PyTorch's default ``nn.Linear`` init (as spec §4.1
    states for TV-ProxyNet). They draw from the global torch RNG, so a seeded build is reproducible.
    """

    def __init__(
        self,
        clip: CLIPModel,
        num_proxies: int = 4,
        temporal_slots: int = 12,
        with_proxies: bool = False,
        frame_chunk: int = 0,
        fp16_on_cuda: bool = True,
    ) -> None:
        super().__init__(clip, frame_chunk=frame_chunk, fp16_on_cuda=fp16_on_cuda)
        if int(num_proxies) < 1:
            raise ValueError(f"model.clipvip.num_proxies={num_proxies}: expected at least 1 (CLIP's class token)")
        if int(temporal_slots) < 1:
            raise ValueError(f"model.clipvip.temporal_slots={temporal_slots}: expected at least 1")
        self.num_proxies = int(num_proxies)
        self.temporal_slots = int(temporal_slots)
        self.with_proxies = bool(with_proxies)
        ref = clip.vision_model.embeddings.class_embedding
        width = self.vision_width
        added = None
        if self.num_proxies > 1:  # a 0-row parameter would be a DDP nuisance; M = 1 simply has none
            added = nn.Parameter(torch.randn(self.num_proxies - 1, width, dtype=ref.dtype, device=ref.device))
        self.register_parameter("added_class_embedding", added)
        self.temporal_embedding = nn.Parameter(
            torch.zeros(self.temporal_slots, width, dtype=ref.dtype, device=ref.device)
        )
        projection = None
        if self.with_proxies:
            projection = nn.Linear(width, self.embed_dim, bias=False).to(device=ref.device, dtype=ref.dtype)
        self.visual_projection_patch = projection
        #: the report of the last :meth:`load_clipvip_checkpoint` (None until one was loaded)
        self.load_report: CheckpointReport | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model_cfg: ModelConfig, frame_chunk: int | None = None) -> ClipVipBackbone:
        """``model.clip`` as for :class:`ClipBackbone`, then ``model.clipvip.checkpoint`` applied over it."""
        clip = clip_from_config(model_cfg)
        opts = model_cfg.clipvip
        backbone = cls(
            clip,
            num_proxies=opts.num_proxies,
            temporal_slots=opts.temporal_slots,
            with_proxies=opts.proxy_projection,
            frame_chunk=model_cfg.frame_chunk if frame_chunk is None else frame_chunk,
            fp16_on_cuda=model_cfg.clip_fp16_on_cuda,
        )
        if str(opts.checkpoint).strip():
            backbone.load_clipvip_checkpoint(os.path.expanduser(str(opts.checkpoint).strip()))
        return backbone

    def half_weights(self) -> None:
        """fp16 cast of every weight, the new tokens included (``logit_scale`` stays float32 as in the base)."""
        super().half_weights()
        for name in ("added_class_embedding", "temporal_embedding"):
            param = getattr(self, name)
            if param is not None:
                param.data = param.data.half()
        if self.visual_projection_patch is not None:
            self.visual_projection_patch.half()

    # ------------------------------------------------------------------ checkpoints
    def clipvip_state_dict(self) -> dict[str, Tensor]:
        """Every weight in CLIP-ViP's checkpoint layout (``clipmodel.`` + HF CLIP names, ``added_cls`` [M−1, W],
        ``temporal_embedding`` [1, S, W], and TP's ``visual_projection_patch.weight`` when present)."""
        state = {CKPT_PREFIX + k: v.detach().clone() for k, v in self.clip.state_dict().items()}
        if self.added_class_embedding is not None:
            state[CKPT_PREFIX + CKPT_ADDED_CLS] = self.added_class_embedding.detach().clone()
        state[CKPT_PREFIX + CKPT_TEMPORAL] = self.temporal_embedding.detach().clone().unsqueeze(0)
        if self.visual_projection_patch is not None:
            state[CKPT_PREFIX + CKPT_PROXY_PROJ] = self.visual_projection_patch.weight.detach().clone()
        return state

    def save_clipvip_checkpoint(self, path: str | os.PathLike) -> Path:
        """Write :meth:`clipvip_state_dict` atomically; ``model.clipvip.checkpoint`` loads it back."""
        from tvr.utils.io import atomic_torch_save

        return atomic_torch_save({k: v.cpu() for k, v in self.clipvip_state_dict().items()}, path)

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """The HF CLIP folder plus ``clipvip_tokens.pt`` (the CLIP-ViP tensors only, in checkpoint layout), written
        together atomically. Load back with ``model.clip=<folder>`` and ``model.clipvip.checkpoint=<folder>/
        clipvip_tokens.pt`` (the report then lists the CLIP weights as missing: they come from the folder)."""
        from tvr.utils.io import atomic_torch_save

        extra = {k: v.cpu() for k, v in self.clipvip_state_dict().items() if not self._is_clip_key(k)}
        return save_clip_atomic(
            self.clip, out_dir, overwrite=True, extra=lambda folder: atomic_torch_save(extra, folder / TOKENS_FILE)
        )

    @staticmethod
    def _is_clip_key(key: str) -> bool:
        name = key[len(CKPT_PREFIX) :]
        return name not in (CKPT_ADDED_CLS, CKPT_TEMPORAL, CKPT_PROXY_PROJ)

    def _target(self, name: str, clip_state: dict[str, Tensor]) -> tuple[str, Tensor] | None:
        """Our state key and tensor for a checkpoint name (``clipmodel.`` already stripped), or None."""
        if name == CKPT_ADDED_CLS:
            added = self.added_class_embedding
            return None if added is None else ("added_class_embedding", added)
        if name == CKPT_TEMPORAL:
            return "temporal_embedding", self.temporal_embedding
        if name == CKPT_PROXY_PROJ:
            proj = self.visual_projection_patch
            return None if proj is None else ("visual_projection_patch.weight", proj.weight)
        return ("clip." + name, clip_state[name]) if name in clip_state else None

    @torch.no_grad()
    def load_clipvip_checkpoint(self, source: str | os.PathLike | dict[str, Tensor]) -> CheckpointReport:
        """Copy a CLIP-ViP post-pretrained checkpoint over the current weights and return (and log) the report.

        ``source``: a file in the ``pretrain_clipvip_base_32.pt`` layout (a flat ``VidCLIP.state_dict()``: keys
        ``clipmodel.<HF CLIP name>``, ``clipmodel.vision_model.embeddings.added_cls`` [M−1, W],
        ``clipmodel.vision_model.embeddings.temporal_embedding`` [1, S, W]; a ``module.`` prefix and a
        ``{"model_state_dict": …}`` wrapper are accepted; a file without any ``clipmodel.`` key is read as bare HF
        CLIP names), or such a dict. Tensors are cast to the backbone's dtypes. A shape mismatch is an error naming
        the key (wrong ViT size, ``num_proxies`` or ``temporal_slots``); a file that maps nothing is an error too.
        """
        where = str(source) if not isinstance(source, dict) else "<state dict>"
        if isinstance(source, dict):
            state = _unwrap_state(source, where)
        else:
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"model.clipvip.checkpoint: file not found: {path}")
            try:
                raw = load_torch_file(path)
            except PickleRefusedError as exc:
                raise ClipVipCheckpointError(f"model.clipvip.checkpoint {exc}") from None
            except TorchFileError as exc:
                raise ClipVipCheckpointError(
                    f"model.clipvip.checkpoint {path}: not a torch checkpoint: {describe_file_start(path)}; expected "
                    "CLIP-ViP's pretrain_clipvip_base_32.pt layout"
                ) from exc
            state = _unwrap_state(raw, where)
        names = {k[len("module.") :] if k.startswith("module.") else k: k for k in state}
        prefixed = any(k.startswith(CKPT_PREFIX) for k in names)
        clip_state = self.clip.state_dict(keep_vars=True)
        planned: list[tuple[str, str, Tensor, Tensor]] = []
        unexpected: list[str] = []
        ignored: list[str] = []
        for name, original in names.items():
            if name.endswith("position_ids"):
                ignored.append(original)
                continue
            if prefixed and not name.startswith(CKPT_PREFIX):
                unexpected.append(original)
                continue
            target = self._target(name[len(CKPT_PREFIX) :] if prefixed else name, clip_state)
            if target is None:
                unexpected.append(original)
                continue
            key, tensor = target
            value = stored = state[original]
            if key == "temporal_embedding" and value.ndim == 3 and value.shape[0] == 1:
                value = value[0]  # CLIP-ViP stores [1, S, W]
            if tuple(value.shape) != tuple(tensor.shape):
                raise ClipVipCheckpointError(
                    f"model.clipvip.checkpoint {where}: {original} has shape {tuple(stored.shape)} but "
                    f"{key} here is {tuple(tensor.shape)} (check that model.clip is the same ViT as the checkpoint, "
                    f"and model.clipvip.num_proxies / temporal_slots)"
                )
            planned.append((original, key, tensor, value))
        # copy only after every shape was checked, so a bad file leaves the weights untouched
        for _, _, tensor, value in planned:
            tensor.data.copy_(value.to(dtype=tensor.dtype))
        mapped = {original: key for original, key, _, _ in planned}
        if not mapped:
            raise ClipVipCheckpointError(
                f"model.clipvip.checkpoint {where}: no tensor matches a CLIP-ViP name (expected keys like "
                f"'{CKPT_PREFIX}{CKPT_TEMPORAL}'); first keys: {list(state)[:5]}"
            )
        ours = {f"clip.{k}" for k in self.clip.state_dict()} | {
            k for k in self.state_dict() if not k.startswith("clip.")
        }
        missing = sorted(ours - set(mapped.values()))
        report = CheckpointReport(where, mapped, missing, sorted(unexpected), sorted(ignored))
        log.info("%s", report.summary())
        if missing or unexpected:
            log.warning("%s", report)
        self.load_report = report
        return report

    # ------------------------------------------------------------------ properties
    @property
    def vision_width(self) -> int:
        return int(self.clip.config.vision_config.hidden_size)

    def proxy_tokens(self) -> Tensor:
        """The M proxy embeddings before position embedding: [class_embedding; added_class_embedding], [M, W]."""
        cls_token = self.clip.vision_model.embeddings.class_embedding.unsqueeze(0)
        if self.added_class_embedding is None:
            return cls_token
        return torch.cat([cls_token, self.added_class_embedding.to(cls_token.dtype)], dim=0)

    def temporal_embedding_for(self, num_frames: int) -> Tensor:
        """The temporal embedding of ``num_frames`` frames, [T, W] (linear interpolation of the learned slots)."""
        if num_frames < 1:
            raise ValueError(f"temporal_embedding_for: need at least one frame, got {num_frames}")
        return interpolate_temporal(self.temporal_embedding, num_frames)

    # ------------------------------------------------------------------ video tower
    def video_tokens(self, pixels: Tensor) -> Tensor:
        """Frames [N, T, 3, S, S] → the input sequence [N, M + T·L, W] (before ``pre_layrnorm``)."""
        emb = self.clip.vision_model.embeddings
        n, t = pixels.shape[:2]
        dtype = emb.patch_embedding.weight.dtype
        patches = emb.patch_embedding(pixels.reshape(n * t, *pixels.shape[2:]).to(dtype))  # [N·T, W, g, g]
        patches = patches.flatten(2).transpose(1, 2)  # [N·T, L, W]
        positions = emb.position_embedding.weight  # [1 + L, W]: CLS position, then the patch grid
        num_patches = patches.shape[1]
        if num_patches + 1 != positions.shape[0]:
            raise ValueError(
                f"encode_video: {tuple(pixels.shape[-2:])} frames give {num_patches} patches but this CLIP has "
                f"position embeddings for {positions.shape[0] - 1} (set data.image_size to the CLIP's image size)"
            )
        time = self.temporal_embedding_for(t).to(patches.dtype)
        patches = patches.reshape(n, t, num_patches, -1) + time[None, :, None, :] + positions[1:]
        proxies = (self.proxy_tokens() + positions[0]).to(patches.dtype)
        return torch.cat([proxies.expand(n, -1, -1), patches.reshape(n, t * num_patches, -1)], dim=1)

    def video_hidden_states(self, pixels: Tensor, frame_mask: Tensor | None = None) -> Tensor:
        """Last-layer hidden states [N, M + T·L, W] (no post-LN) of the proxy-guided tower."""
        vision = self.clip.vision_model
        n, t = pixels.shape[:2]
        x = vision.pre_layrnorm(self.video_tokens(pixels))
        key_mask = None
        if frame_mask is not None and not bool((frame_mask != 0).all()):
            # proxies may not read padded frames' patches; the M proxies themselves stay visible
            per_frame = (x.shape[1] - self.num_proxies) // t
            real = (frame_mask != 0).to(x.device).repeat_interleave(per_frame, dim=1)  # [N, T·L]
            keep = torch.cat([real.new_ones(n, self.num_proxies), real], dim=1)  # [N, M + T·L]
            key_mask = keep[:, None, None, :]
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in vision.encoder.layers:
            if recompute:
                # the proxy-guided layer calls the HF layer's parts, not its checkpointed forward: checkpoint it here
                x = checkpoint(proxy_guided_layer, layer, x, self.num_proxies, t, key_mask, use_reentrant=False)
            else:
                x = proxy_guided_layer(layer, x, self.num_proxies, t, key_mask)
        return x

    def encode_frames(self, pixels: Tensor) -> Tensor:
        raise NotImplementedError(
            "ClipVipBackbone has no per-frame features (its frames attend to each other through the video "
            "proxies); use encode_video, or model.backbone=clip for per-frame CLIP features"
        )

    def encode_video(self, pixels: Tensor, frame_mask: Tensor) -> VideoFeatures:
        """Frames [N, F, 3, S, S] and mask [N, F] → VideoFeatures(frames [N, 1, D], frame_mask [N, 1],
        proxies [N, M, D] or None), float32 and unnormalised.

        ``frames`` holds the projected, post-LN first proxy (CLIP-ViP's video embedding). The output
        ``frame_mask`` is 1 for every video with at least one real frame (always, under CLIP-ViP sampling)."""
        if pixels.ndim != 5 or pixels.shape[2] != 3:
            raise ValueError(f"encode_video: expected pixels [N, F, 3, S, S], got {tuple(pixels.shape)}")
        n, f = pixels.shape[:2]
        if tuple(frame_mask.shape) != (n, f):
            raise ValueError(f"encode_video: frame_mask {tuple(frame_mask.shape)} does not match pixels {(n, f)}")
        out_mask = (frame_mask != 0).any(dim=1, keepdim=True).to(frame_mask.dtype)
        if n == 0 or f == 0:
            frames = pixels.new_zeros(n, 1, self.embed_dim, dtype=torch.float32)
            proxies = pixels.new_zeros(n, self.num_proxies, self.embed_dim, dtype=torch.float32)
            return VideoFeatures(frames, out_mask, proxies if self.with_proxies else None)
        step = max(1, self.frame_chunk // f) if self.frame_chunk > 0 else n
        pooled, proxies = [], []
        vision = self.clip.vision_model
        for start in range(0, n, step):
            with self.reference_precision():
                hidden = self.video_hidden_states(pixels[start : start + step], frame_mask[start : start + step])
                pooled.append(self.clip.visual_projection(vision.post_layernorm(hidden[:, 0])).float())
                if self.visual_projection_patch is not None:
                    proxies.append(self.visual_projection_patch(hidden[:, : self.num_proxies]).float())
        return VideoFeatures(torch.cat(pooled).unsqueeze(1), out_mask, torch.cat(proxies) if proxies else None)
