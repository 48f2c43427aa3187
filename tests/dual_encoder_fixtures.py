"""Tiny randomly initialised CLIP, SigLIP and SigLIP 2 (NaFlex) dual encoders saved with ``save_pretrained``, with
tokenizer files made offline: CLIP's byte-level BPE from tvr's tiny merges, SigLIP's SentencePiece model trained on a
few sentences, SigLIP 2's Gemma-style BPE from the ``tokenizers`` library. Built once per test session
(``dual_encoders`` in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import torch

#: words the tiny SentencePiece / BPE vocabularies are learned from (the search tests' captions among them)
CORPUS = [
    "a red screen",
    "a green screen",
    "a blue screen",
    "a yellow screen",
    "a magenta screen",
    "a dog runs on the beach",
    "people dancing at night",
    "the white square moves to the right",
    "a man rides a bicycle along the river",
    "a brown bear walking on the rock",
] * 20

TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def save_tiny_clip(folder: Path) -> Path:
    """A CLIPModel (32-d, 32-px images of 16-px patches, context 77) with CLIP's tokenizer class over tvr's tiny
    BPE vocabulary, and CLIP's image processor settings."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

    from tvr.data.tokenizer import build_tiny_tokenizer_files

    torch.manual_seed(0)
    vocab = folder / "bpe"
    build_tiny_tokenizer_files(vocab)
    tokenizer = CLIPTokenizer.from_pretrained(str(vocab))
    text = {**TEXT, "vocab_size": len(tokenizer), "max_position_embeddings": 77}
    text.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=0)
    config = CLIPConfig(
        text_config=text, vision_config={**VISION, "image_size": 32, "patch_size": 16}, projection_dim=24
    )
    out = folder / "clip"
    CLIPModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


def _sentencepiece_model(folder: Path) -> Path:
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(folder / "spiece"),
        vocab_size=40,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        minloglevel=2,
        num_threads=1,
    )
    return folder / "spiece.model"


def _siglip_text(tokenizer) -> dict:
    """A SigLIP text tower's settings for ``tokenizer``: its vocabulary, the 64-token context, its special ids."""
    return {
        **TEXT,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
    }


def _save(out: Path, model, tokenizer) -> Path:
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_tiny_siglip(folder: Path) -> Path:
    """A SiglipModel (32-d, 32-px images of 16-px patches, text context 64) with SigLIP's SentencePiece tokenizer
    (trained here on :data:`CORPUS`) and SigLIP's image processor settings."""
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipTokenizer

    torch.manual_seed(1)
    tokenizer = SiglipTokenizer(vocab_file=str(_sentencepiece_model(folder / "spm")), model_max_length=64)
    config = SiglipConfig(
        text_config=_siglip_text(tokenizer), vision_config={**VISION, "image_size": 32, "patch_size": 16}
    )
    out = _save(folder / "siglip", SiglipModel(config), tokenizer)
    SiglipImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(out)
    return out


def save_tiny_siglip2(folder: Path) -> Path:
    """A Siglip2Model (NaFlex: 16 patches of 8 px at most) with a Gemma-style BPE tokenizer trained here."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Siglip2Config, Siglip2Model

    torch.manual_seed(2)
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
    backend.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", model_max_length=64
    )
    config = Siglip2Config(
        text_config=_siglip_text(tokenizer), vision_config={**VISION, "patch_size": 8, "num_patches": 16}
    )
    out = _save(folder / "siglip2", Siglip2Model(config), tokenizer)
    (out / "preprocessor_config.json").write_text(
        '{"image_processor_type": "Siglip2ImageProcessor", "patch_size": 8, "max_num_patches": 16, '
        '"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}\n'
    )
    return out
