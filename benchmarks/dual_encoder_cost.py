"""What a ``tvr index --model`` index costs on a CPU: indexing throughput and cold ``tvr search`` start, with a
full-size CLIP ViT-B/32 of random weights (the architecture, sizes and file layout of ``openai/clip-vit-base-patch32``,
so the same arithmetic and the same bytes to load; no real weights can be had offline here, so nothing about search
quality is measured).

* ``tvr index REAL_SCENES --model B32_FOLDER``: seconds, windows and frames a second (each decoded frame goes through
  the image tower once);
* cold ``tvr search INDEX QUERY --json`` in fresh processes, three ways: ``export`` (the CLIP text side exported by
  ``tvr index``: TorchScript + the tokenizer as data), ``full`` (``TVR_QUICK_QUERIES=0``: transformers imported, the
  whole model read from the folder — the path every SigLIP index takes, whose tokenizer cannot be exported), and, for
  reference, the default encoder's ``numpy`` query side on an index of the same clips.

    python benchmarks/dual_encoder_cost.py [--runs 5] [--videos ../shared/data/real-scenes]

Writes benchmarks/results/dual_encoder_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.search_cli import summary, timed  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "dual_encoder_cost.json"
SHARED = Path(os.environ.get("TVR_SHARED_DATA", ROOT.parent / "shared" / "data"))
TVR = [sys.executable, "-m", "tvr.cli"]


def write_b32(folder: Path, bpe: Path) -> Path:
    """A random CLIP ViT-B/32 (transformers' CLIPConfig defaults are its sizes) with CLIP's real tokenizer files and
    image processor settings, saved as the hub's folder is."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

    from tvr.data.tokenizer import read_clip_merges, write_tokenizer_files

    torch.manual_seed(0)
    write_tokenizer_files(folder / "bpe", read_clip_merges(bpe))
    tokenizer = CLIPTokenizer.from_pretrained(str(folder / "bpe"))
    model = CLIPModel(CLIPConfig())
    out = folder / "clip-vit-base-patch32-random"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=Path, default=SHARED / "real-scenes")
    parser.add_argument("--query", default="a brown bear walking on the rock")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="tvr-dual-encoder-cost-"))
    env = {**os.environ, "TVR_CACHE_DIR": str(scratch / "cache"), "TVR_NO_PROGRESS": "1"}
    model = write_b32(scratch, SHARED / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz")
    load_before = os.getloadavg()
    indexes = {"clip": scratch / "clip.idx", "default": scratch / "default.idx"}
    built = {}
    for name, extra in (("clip", ["--model", str(model)]), ("default", [])):
        start = time.perf_counter()
        command = [*TVR, "index", str(args.videos), "--out", str(indexes[name]), "--device", "cpu", *extra]
        subprocess.run(command, check=True, env=env, cwd=ROOT, capture_output=True)
        report = json.loads((indexes[name] / "report.json").read_text())
        built[name] = {
            "wall_s": round(time.perf_counter() - start, 2),
            "index_s": report["seconds"],
            "windows": report["rows"],
            "windows_per_second": report["windows_per_second"],
            "decode_s": report["decode_seconds"],
            "encode_s": report["encode_seconds"],
        }
    frames = json.loads((indexes["clip"] / "manifest.json").read_text())
    unique_frames = 0
    from tvr.search.windows import FrameSpec, decode_windows

    spec = FrameSpec(**frames["frames"])
    for video in frames["videos"]:
        decoded = decode_windows(args.videos / video["video"], spec, frames["window"], frames["stride"])
        unique_frames += len(decoded.frames)
    built["clip"]["frames"] = unique_frames
    built["clip"]["frames_per_encode_second"] = round(unique_frames / built["clip"]["encode_s"], 2)

    search = [*TVR, "search", str(indexes["clip"]), args.query, "--json"]
    modes = {
        "export": (search, env),
        "full": (search, {**env, "TVR_QUICK_QUERIES": "0"}),
        "numpy_default": ([*TVR, "search", str(indexes["default"]), args.query, "--json"], env),
    }
    runs: dict[str, list[dict]] = {name: [] for name in modes}
    for _ in range(args.runs):  # interleaved: drift in the machine's load hits every mode alike
        for name, (command, mode_env) in modes.items():
            runs[name].append(timed(command, mode_env))
    record = {
        "model": "random CLIP ViT-B/32 (CLIPConfig defaults), CLIP's tokenizer files",
        "videos": str(args.videos),
        "query": args.query,
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "weights_bytes": sum(p.stat().st_size for p in model.glob("*.safetensors")),
        "export_written": any((scratch / "cache" / "query-encoders").glob("*-v1-torch*")),
        "index": built,
        "cold_search": {name: summary(r) for name, r in runs.items()},
        "same_hits_export_and_full": json.loads(runs["export"][0]["stdout"]) == json.loads(runs["full"][0]["stdout"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
