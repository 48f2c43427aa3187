"""``tvr index --model``: pretrained CLIP, SigLIP and SigLIP 2 (NaFlex) dual encoders used zero-shot, on tiny randomly
initialised models saved with ``save_pretrained`` (tests/dual_encoder_fixtures.py). Index → search → serve →
eval-search end to end; a window's embedding is the normalised mean of the model's own normalised
``get_image_features`` over the window's frames (fed by the model's own image processor), a query's is its own
``get_text_features`` (fed as the model was trained); the stamp depends on the content, not the folder; a hub id
offline and a folder that is not a dual encoder are one line each."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient
from search_fixtures import VIDEOS
from typer.testing import CliRunner

from tvr.cli import app
from tvr.search import open_index
from tvr.search.encoders import EncoderMismatchError, PretrainedEncoder
from tvr.search.layout import MANIFEST
from tvr.search.windows import FrameSpec, decode_windows

runner = CliRunner()
FAMILIES = ("clip", "siglip", "siglip2")
WINDOW = ["--window", "2", "--stride", "1", "-j", "1"]


def _index(videos: Path, out: Path, model: Path | str, *extra: str):
    return runner.invoke(app, ["index", str(videos), "--out", str(out), "--model", str(model), *WINDOW, *extra])


@pytest.fixture(scope="module", params=FAMILIES)
def built(request, search_setup, dual_encoders, tmp_path_factory: pytest.TempPathFactory):
    """(family, model folder, index) of search_setup's videos indexed with each tiny model."""
    model = getattr(dual_encoders, request.param)
    out = tmp_path_factory.mktemp(f"dual-{request.param}") / "idx"
    result = _index(search_setup.videos, out, model)
    assert result.exit_code == 0, result.output
    return request.param, model, out


def _own_model(folder: Path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()


def _pooled(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def _own_image_features(folder: Path, family: str, crops: np.ndarray) -> torch.Tensor:
    """get_image_features of uint8 crops [n, S, S, 3] fed by the folder's own image processor (crops already at the
    model's size: the processor only rescales, normalises and, for NaFlex, cuts patches)."""
    from transformers import CLIPImageProcessorPil, Siglip2ImageProcessorPil, SiglipImageProcessorPil

    kind = {"clip": CLIPImageProcessorPil, "siglip": SiglipImageProcessorPil, "siglip2": Siglip2ImageProcessorPil}
    processor = kind[family].from_pretrained(str(folder))
    images = list(crops)
    model = _own_model(folder)
    with torch.no_grad():
        if family == "siglip2":
            inputs = processor(images=images, return_tensors="pt")
            return _pooled(model.get_image_features(**inputs))
        inputs = processor(images=images, do_resize=False, do_center_crop=False, return_tensors="pt")
        return _pooled(model.get_image_features(pixel_values=inputs["pixel_values"]))


def _own_text_features(folder: Path, family: str, texts: list[str]) -> torch.Tensor:
    """get_text_features as each family is fed: CLIP with its attention mask (any padding), SigLIP padded to its 64
    tokens without a mask."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = _own_model(folder)
    with torch.no_grad():
        if family == "clip":
            encoded = tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
            return _pooled(model.get_text_features(**encoded))
        encoded = tokenizer(texts, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
        return _pooled(model.get_text_features(input_ids=encoded["input_ids"]))


def test_window_embedding_is_the_mean_of_the_models_own_image_features(built, search_setup) -> None:
    family, folder, out = built
    index = open_index(out)
    rows = {v["video"]: v for v in index.videos}
    for name in ("red.mp4", "sub/yellow.mp4"):
        entry = rows[name]
        decoded = decode_windows(search_setup.videos / name, FrameSpec(**index.manifest["frames"]), 2.0, 1.0)
        frames = F.normalize(_own_image_features(folder, family, decoded.frames), dim=-1)
        for w, slots in enumerate(decoded.slots):
            want = F.normalize(frames[slots[slots >= 0]].mean(dim=0), dim=0).numpy()
            row = entry["first_row"] + w
            got = index.readers[int(index.table_shard[row])].emb[int(index.table_row[row])]
            np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("quick", ["1", "0"])
def test_query_vector_is_the_models_own_text_features(built, monkeypatch, quick: str) -> None:
    """encode_queries gives the model's own normalised get_text_features (from the query export where there is one,
    TVR_QUICK_QUERIES=0: the full model), and it is the vector the shortlist scores windows with."""
    family, folder, out = built
    monkeypatch.setenv("TVR_QUICK_QUERIES", quick)
    texts = ["a red screen", "a dog runs on the beach", "Ünïcödé café!", " ".join(["a long caption"] * 40)]
    index = open_index(out)
    vectors = index.encode_queries(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), index.dim)
    want = F.normalize(_own_text_features(folder, family, texts), dim=-1).numpy()
    np.testing.assert_allclose(vectors, want, atol=2e-5)
    emb = np.stack([index.readers[int(s)].emb[int(r)] for s, r in zip(index.table_shard, index.table_row, strict=True)])
    for text, vector in zip(texts[:2], vectors[:2], strict=True):
        best = index.search(text, k=1, all_windows=True)[0]
        assert best.score == pytest.approx(float((emb @ vector).max()), abs=1e-6)


def test_index_search_serve_eval_search_end_to_end(built, search_setup, tmp_path: Path) -> None:
    family, _, out = built
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["model"]["encoder"] == "pretrained" and manifest["model"]["family"] == family
    assert manifest["head"] == {"name": "clip4clip", "indexable": True}
    assert manifest["frames"]["resize"] == ("short_side" if family == "clip" else "square")
    result = runner.invoke(app, ["search", str(out), "a red screen", "-k", "3", "--json"])
    assert result.exit_code == 0, result.output
    hits = json.loads(result.stdout)
    assert len(hits) == 3 and {h["video"] for h in hits} <= set(VIDEOS)

    from tvr.search.server import create_app

    client = TestClient(create_app(open_index(out)))
    answer = client.get("/api/search", params={"q": "a red screen", "k": 3}).json()
    assert [(a["video"], a["start"]) for a in answer] == [(h["video"], h["start"]) for h in hits]

    queries = tmp_path / "queries.csv"
    with open(queries, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["query", "video"])
        writer.writerows([caption, name] for name, (caption, _, _) in VIDEOS.items())
    result = runner.invoke(app, ["eval-search", str(out), str(queries), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["queries"] == len(VIDEOS) and set(report["metrics"]) >= {"R1", "R5", "MdR"}


def test_the_stamp_is_the_content_not_the_folder(dual_encoders, search_setup, tmp_path: Path, monkeypatch) -> None:
    """The same model copied elsewhere has the same stamp, opens the index (TVR_QUICK_QUERIES=0: from the folder
    given with model=) and updates it; one weight changed is another model."""
    out = tmp_path / "idx"
    assert _index(search_setup.videos, out, dual_encoders.siglip).exit_code == 0
    moved = tmp_path / "elsewhere" / "my-siglip"
    shutil.copytree(dual_encoders.siglip, moved)
    before = PretrainedEncoder(str(dual_encoders.siglip)).stamp()
    assert PretrainedEncoder(str(moved)).stamp()["id"] == before["id"]
    monkeypatch.setenv("TVR_QUICK_QUERIES", "0")
    index = open_index(out, model=str(moved))
    assert index.search("a red screen", k=1)
    result = runner.invoke(app, ["search", str(out), "a red screen", "--model", str(moved), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout), result.output
    # the moved model updates the index as the first one would (the same model: nothing to embed again)
    result = _index(search_setup.videos, out, moved)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["embedded"] == 0

    from safetensors.torch import load_file, save_file

    weights = load_file(moved / "model.safetensors")
    name = next(k for k in sorted(weights) if k.endswith("weight"))
    weights[name] = weights[name] + 1e-3
    save_file(weights, moved / "model.safetensors", metadata={"format": "pt"})
    assert PretrainedEncoder(str(moved)).stamp()["id"] != before["id"]
    with pytest.raises(EncoderMismatchError, match="built with the pretrained model"):
        open_index(out, model=str(moved))


def test_an_openai_clip_file_indexes_as_its_converted_folder(search_setup, shared_data, tmp_path: Path) -> None:
    """An OpenAI CLIP file (here a tiny one in OpenAI's layout) needs CLIP's BPE beside it (one line otherwise), and
    has the stamp of the folder `tvr convert-openai` makes of it: the same weights and tokenizer, another form."""
    import test_convert_openai

    weights = tmp_path / "openai" / "ViT-tiny.pt"
    weights.parent.mkdir()
    torch.save(test_convert_openai.openai_state_dict(), weights)
    line = _one_line_error(_index(search_setup.videos, tmp_path / "idx", weights))
    assert "no bpe_simple_vocab_16e6.txt.gz beside it" in line
    bpe = shared_data / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz"
    (weights.parent / bpe.name).symlink_to(bpe)
    result = _index(search_setup.videos, tmp_path / "idx", weights)
    assert result.exit_code == 0, result.output
    stamp = json.loads((tmp_path / "idx" / MANIFEST).read_text())["model"]
    assert (stamp["encoder"], stamp["family"], stamp["dim"]) == ("pretrained", "clip", test_convert_openai.EMBED)
    result = runner.invoke(app, ["convert-openai", str(weights), str(tmp_path / "hf"), "--bpe", str(bpe)])
    assert result.exit_code == 0, result.output
    assert PretrainedEncoder(str(tmp_path / "hf")).stamp()["id"] == stamp["id"]


def test_a_tvr_checkpoint_given_as_model_is_indexed_as_a_checkpoint(search_setup, tmp_path: Path) -> None:
    result = _index(search_setup.videos, tmp_path / "idx", search_setup.checkpoint)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "idx" / MANIFEST).read_text())["model"]["encoder"] == "checkpoint"


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error:") and len(lines) <= 2, result.output  # the error, and the --debug hint
    return lines[0]


def test_a_hub_model_offline_is_one_line(search_setup, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # an empty cache, whatever this machine has
    for spec in ("someone/some-clip", "clip-b32"):
        line = _one_line_error(_index(search_setup.videos, tmp_path / "idx", spec))
        assert "not in the local Hugging Face cache" in line and "offline" in line
    assert not (tmp_path / "idx").exists()


def test_a_folder_that_is_not_a_dual_encoder_is_one_line(search_setup, tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    bert = tmp_path / "bert"
    BertModel(
        BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
    ).save_pretrained(bert)
    line = _one_line_error(_index(search_setup.videos, tmp_path / "idx", bert))
    assert "a bert model" in line and "not a CLIP- or SigLIP-family dual encoder" in line
    random = tmp_path / "random"
    random.mkdir()
    (random / "notes.txt").write_text("hello\n")
    line = _one_line_error(_index(search_setup.videos, tmp_path / "idx", random))
    assert "no config.json" in line
    line = _one_line_error(_index(search_setup.videos, tmp_path / "idx", tmp_path / "missing"))
    assert "no such folder or file" in line
    assert not (tmp_path / "idx").exists()


def test_presets_name_hub_ids_and_the_command_line_lists_them() -> None:
    from tvr.models.dual_encoder import PRESETS, resolve_source
    from tvr.search.defaults import DUAL_ENCODER_PRESETS

    assert tuple(PRESETS) == DUAL_ENCODER_PRESETS
    assert resolve_source("clip-b32").location == "openai/clip-vit-base-patch32"
    assert resolve_source("siglip-base").location == "google/siglip-base-patch16-224"
    assert all(resolve_source(name).kind == "hub" for name in PRESETS)
