"""CLIP-ViP proxy-guided attention: tvr's factorised layer against a dense (M + T·L)² masked attention.

One ViT-B/32-sized HF ``CLIPEncoderLayer`` (width 768, 12 heads, quick-GELU MLP 3072; random weights) on N videos of
T frames × L = 49 patches with M = 4 proxies. Contenders, alternated and repeated in one process, minimum kept:

* ``factorised``: :func:`tvr.models.backbones.clipvip.modeling.proxy_guided_layer` (proxies over all tokens + N·T
frame-local blocks).
* ``dense_mask``: the same layer weights with one ``F.scaled_dot_product_attention`` over the whole sequence and a
  boolean (M + T·L)² mask — what the brief rules out.

Both are timed forward-only (``torch.no_grad``) and forward + backward; the max |difference| of their outputs is
reported as a correctness check. Run:

    .venv/bin/python benchmarks/clipvip_attention.py        # writes benchmarks/results/clipvip_attention.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "clipvip_attention.json"


def build_layer(seed: int):  # noqa: ANN201 - torch imported lazily
    import torch
    from transformers import CLIPVisionConfig
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer

    torch.manual_seed(seed)
    cfg = CLIPVisionConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12, hidden_act="quick_gelu")
    layer = CLIPEncoderLayer(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    return layer.eval()


def dense_mask(m: int, t: int, patches: int):  # noqa: ANN201
    import torch

    s = m + t * patches
    frame = torch.full((s,), -1)
    frame[m:] = torch.arange(t).repeat_interleave(patches)
    allowed = torch.zeros(s, s, dtype=torch.bool)
    allowed[:m] = True
    allowed[m:, :m] = True
    allowed[m:, m:] = frame[m:, None] == frame[None, m:]
    return allowed


def dense_layer(layer, x, mask):  # noqa: ANN001, ANN201
    import torch.nn.functional as F

    attn = layer.self_attn
    n, s, w = x.shape
    h = layer.layer_norm1(x)

    def split(z):  # noqa: ANN001, ANN202
        return z.view(n, s, attn.num_heads, attn.head_dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        split(attn.q_proj(h)), split(attn.k_proj(h)), split(attn.v_proj(h)), attn_mask=mask, scale=attn.scale
    )
    x = x + attn.out_proj(out.transpose(1, 2).reshape(n, s, w))
    return x + layer.mlp(layer.layer_norm2(x))


def timed(fn, backward: bool) -> float:  # noqa: ANN001
    import torch

    start = time.perf_counter()
    if backward:
        fn().sum().backward()
    else:
        with torch.no_grad():
            fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=2)
    parser.add_argument("--frames", type=int, nargs="+", default=[12, 32])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    import torch

    from tvr.models.backbones.clipvip.modeling import proxy_guided_layer
    from tvr.utils.io import atomic_write_json

    torch.set_num_threads(args.threads)
    m, patches = 4, 49
    layer = build_layer(0)
    load_before = os.getloadavg()
    print(f"load average before: {load_before}")
    results = []
    for t in args.frames:
        s = m + t * patches
        x = torch.randn(args.videos, s, 768)
        mask = dense_mask(m, t, patches)
        contenders = {
            "factorised": lambda x=x, t=t: proxy_guided_layer(layer, x, m, t),
            "dense_mask": lambda x=x, mask=mask: dense_layer(layer, x, mask),
        }
        with torch.no_grad():
            diff = (contenders["factorised"]() - contenders["dense_mask"]()).abs().max().item()
        for backward in (False, True):
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for fn in contenders.values():  # warm-up
                timed(fn, backward)
            for _ in range(args.reps):
                for name, fn in contenders.items():
                    layer.zero_grad(set_to_none=True)
                    times[name].append(timed(fn, backward))
            best = {name: min(v) for name, v in times.items()}
            row = {
                "frames": t,
                "tokens": s,
                "mode": "forward+backward" if backward else "forward",
                "seconds_min": best,
                "seconds_all": times,
                "dense_over_factorised": best["dense_mask"] / best["factorised"],
                "attention_scores_per_head": {
                    "factorised": args.videos * (m * s + t * patches * (m + patches)),
                    "dense_mask": args.videos * s * s,
                },
                "max_abs_diff": diff,
            }
            results.append(row)
            print(
                f"T={t:2d} ({s} tokens) {row['mode']:>16}: factorised {best['factorised'] * 1e3:7.1f} ms, "
                f"dense mask {best['dense_mask'] * 1e3:7.1f} ms, ratio {row['dense_over_factorised']:.2f}, "
                f"max |diff| {diff:.1e}"
            )
    load_after = os.getloadavg()
    print(f"load average after: {load_after}")
    atomic_write_json(
        args.out,
        {
            "benchmark": "clipvip_attention",
            "layer": "ViT-B/32 CLIPEncoderLayer (768 wide, 12 heads), M=4 proxies, L=49 patches, random weights",
            "videos": args.videos,
            "reps": args.reps,
            "threads": args.threads,
            "torch": torch.__version__,
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "results": results,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
