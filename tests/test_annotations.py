"""Annotation readers: exact counts on the real files in ../shared/data, exact-format fixtures, malformed input."""

from __future__ import annotations

import json
import pickle
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from annotation_fixtures import (
    write_activitynet,
    write_didemo,
    write_generic,
    write_msrvtt,
    write_msvd,
)
from conftest import SHARED_DATA

from tvr.config import DataConfig
from tvr.data.annotations import (
    AnnotationError,
    CaptionRecord,
    clear_cache,
    describe_split_source,
    held_out_videos,
    load_split,
)


def _cfg(dataset: str, folder: Path | str, **kw) -> DataConfig:
    return DataConfig(dataset=dataset, annotations=str(folder), **kw)


def _groups(split) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {v: [] for v in split.videos}
    for text, v in zip(split.texts, split.text_video, strict=True):
        out[split.videos[v]].append(text)
    return out


def _assert_square(split) -> None:
    assert split.text_video == list(range(len(split.videos)))
    assert len(split.texts) == len(split.videos) == len(split.video_spans)


def _assert_contiguous(split) -> None:
    """multi_caption evaluation splits list each video's captions together, videos in gallery order."""
    assert split.text_video == sorted(split.text_video)
    assert set(split.text_video) == set(range(len(split.videos)))


# =============================================================================================== real files


@pytest.fixture(scope="module")
def real_msrvtt() -> dict:
    """Every MSR-VTT view the tests need, read once (the release zips hold 23 MB of JSON)."""
    root = SHARED_DATA / "msrvtt"
    if not root.is_dir():
        pytest.skip(f"real data folder not found: {root}")
    out = {"root": root}
    out["9k_all"] = load_split(_cfg("msrvtt", root, val_fraction=0.0), "train")
    out["7k_all"] = load_split(_cfg("msrvtt", root, train_split="7k", val_fraction=0.0), "train")
    cfg = _cfg("msrvtt", root)
    out["train"] = load_split(cfg, "train")
    out["val"] = load_split(cfg, "val")
    out["test"] = load_split(cfg, "test")
    out["test_multi"] = load_split(cfg, "test_multi")
    out["describe"] = describe_split_source(cfg)
    # an independent read of the release JSONs: sen_id -> (video, caption)
    sentences = []
    for zip_name, member in (
        ("train_val_annotation.zip", "train_val_videodatainfo.json"),
        ("test_videodatainfo.json.zip", "test_videodatainfo.json"),
    ):
        with zipfile.ZipFile(root / zip_name) as archive:
            sentences += json.loads(archive.read(member))["sentences"]
    out["sentences"] = sentences
    return out


def test_msrvtt_9k_and_7k_training_pairs(real_msrvtt):
    nine, seven = real_msrvtt["9k_all"], real_msrvtt["7k_all"]
    assert (len(nine.texts), len(nine.videos)) == (180_000, 9_000)
    assert (len(seven.texts), len(seven.videos)) == (140_200, 7_010)
    assert nine.protocol == seven.protocol == "multi_caption"
    assert set(Counter(nine.text_video).values()) == {20}
    assert set(seven.videos) <= set(nine.videos)
    # training pairs keep the release sentence order (CLIP4Clip iterates the sentences in file order)
    listed = set(nine.videos)
    expected = [(s["video_id"], s["caption"]) for s in real_msrvtt["sentences"] if s["video_id"] in listed]
    got = [(nine.videos[v], t) for t, v in zip(nine.texts, nine.text_video, strict=True)]
    assert got == expected
    assert nine.records[0] == CaptionRecord(expected[0][0], expected[0][1], None, None)


def test_msrvtt_1ka_test(real_msrvtt):
    test = real_msrvtt["test"]
    assert test.protocol == "one_to_one"
    _assert_square(test)
    assert len(test.videos) == 1000 and len(set(test.videos)) == 1000
    assert (test.videos[0], test.texts[0]) == ("video9770", "a person is connecting something to system")
    assert not set(test.videos) & set(real_msrvtt["9k_all"].videos)
    assert set(test.videos) | set(real_msrvtt["9k_all"].videos) == {f"video{k}" for k in range(10_000)}

    multi = real_msrvtt["test_multi"]
    assert multi.protocol == "multi_caption"
    assert (len(multi.texts), len(multi.videos)) == (20_000, 1000)
    assert set(multi.videos) == set(test.videos)
    _assert_contiguous(multi)


def test_msrvtt_seeded_validation_is_carved_from_train(real_msrvtt):
    train, val = real_msrvtt["train"], real_msrvtt["val"]
    assert len(val.videos) == round(0.05 * 9000) == 450
    assert (len(train.videos), len(train.texts)) == (8550, 8550 * 20)
    assert not set(train.videos) & set(val.videos)
    assert set(train.videos) | set(val.videos) == set(real_msrvtt["9k_all"].videos)
    assert not set(val.videos) & set(real_msrvtt["test"].videos)
    # val uses the 1k-A protocol: one caption per video, the one with the smallest sen_id
    assert val.protocol == "one_to_one"
    _assert_square(val)
    first: dict[str, tuple[int, str]] = {}
    for s in real_msrvtt["sentences"]:
        if s["video_id"] not in first or s["sen_id"] < first[s["video_id"]][0]:
            first[s["video_id"]] = (s["sen_id"], s["caption"])
    assert val.texts == [first[v][1] for v in val.videos]
    # recorded for the run dir, and reproducible from the rule it states
    record = real_msrvtt["describe"]["splits"]["val"]
    assert record["source"] == "held_out_from_train" and record["seed"] == 0 and record["fraction"] == 0.05
    assert record["video_ids"] == val.videos
    assert held_out_videos(real_msrvtt["9k_all"].videos, 0.05, 0) == val.videos
    assert real_msrvtt["describe"]["splits"]["test"]["num_texts"] == 1000


def test_didemo_real_files(shared_data):
    root = shared_data / "didemo"
    cfg = _cfg("didemo", root)
    train, val, test = (load_split(cfg, s) for s in ("train", "val", "test"))
    assert [len(s.videos) for s in (train, val, test)] == [8394, 1065, 1002]
    for split in (train, val, test):
        assert split.protocol == "paragraph"
        _assert_square(split)
        assert set(split.video_spans) == {(None, None)}
    assert not (set(train.videos) & set(val.videos) or set(train.videos) & set(test.videos))
    assert not set(val.videos) & set(test.videos)
    first = json.loads((root / "test.jsonl").read_text().split("\n")[0])
    assert test.videos[0] == first["clip_id"]
    assert test.texts[0] == " ".join(s.strip() for s in first["text"])
    assert describe_split_source(cfg)["splits"]["val"]["source"] == "official"


def test_activitynet_real_files(shared_data):
    root = shared_data / "activitynet"
    cfg = _cfg("activitynet", root)
    train, val, test = (load_split(cfg, s) for s in ("train", "val", "test"))
    assert len(test.videos) == 4917
    assert len(val.videos) == round(0.05 * 10006) == 500
    assert len(train.videos) == 10006 - 500
    for split in (train, val, test):
        assert split.protocol == "paragraph"
        _assert_square(split)
    assert not set(train.videos) & set(val.videos)
    assert not (set(train.videos) | set(val.videos)) & set(test.videos)
    assert all(v.startswith("v_") for v in test.videos)
    # sentences keep a leading space in the file; each is stripped before joining
    rows = [json.loads(line) for line in (root / "val1.jsonl").read_text().splitlines() if line.strip()]
    assert rows[0]["text"][1].startswith(" ")
    assert test.videos == [r["clip_id"] for r in rows]
    assert test.texts == [" ".join(s.strip() for s in r["text"]) for r in rows]
    assert not any(t != t.strip() for t in test.texts)


def test_generic_real_scenes_csv(shared_data):
    split = load_split(_cfg("generic", shared_data / "real-scenes", val_fraction=0.0), "train")
    assert len(split.texts) == len(split.videos) == 19
    assert split.videos[0] == "brown_bear_rock.mp4"  # the column holds file names: use video_pattern "{video_id}"


# =============================================================================================== fixtures

VIDS = [f"video{k}" for k in range(10)]


@pytest.mark.parametrize("layout", ["json", "zips"])
def test_msrvtt_fixture_layouts(tmp_path, layout):
    truth = write_msrvtt(tmp_path, VIDS, 3, test_ids=VIDS[8:], layout=layout)
    cfg = _cfg("msrvtt", tmp_path, val_fraction=0.0)
    train = load_split(cfg, "train")
    assert train.videos == VIDS[:8]
    # interleaved file order: caption 0 of every video, then caption 1, ...
    assert train.texts == [truth["captions"][v][j] for j in range(3) for v in VIDS[:8]]
    assert [train.videos[v] for v in train.text_video] == [v for _ in range(3) for v in VIDS[:8]]
    seven = load_split(_cfg("msrvtt", tmp_path, val_fraction=0.0, train_split="7k"), "train")
    assert seven.videos == truth["train_7k"]
    test = load_split(cfg, "test")
    assert (test.videos, test.texts) == (VIDS[8:], [truth["captions"][v][0] for v in VIDS[8:]])
    multi = load_split(cfg, "test_multi")
    assert multi.texts == [c for v in VIDS[8:] for c in truth["captions"][v]]
    assert multi.text_video == [0, 0, 0, 1, 1, 1]


def test_msrvtt_holdout_and_limits(tmp_path):
    truth = write_msrvtt(tmp_path, VIDS, 3, test_ids=VIDS[8:])
    cfg = _cfg("msrvtt", tmp_path, val_fraction=0.25, val_seed=3)
    held = held_out_videos(VIDS[:8], 0.25, 3)
    val = load_split(cfg, "val")
    train = load_split(cfg, "train")
    assert val.videos == held and len(held) == 2
    assert train.videos == [v for v in VIDS[:8] if v not in held]
    assert len(train.texts) == 3 * 6
    # val: the caption with the smallest sen_id, which is caption 0 in the fixture
    assert val.protocol == "one_to_one" and val.texts == [truth["captions"][v][0] for v in held]
    limited = load_split(_cfg("msrvtt", tmp_path, val_fraction=0.0, limit_train=5, limit_eval=1), "train")
    assert len(limited.texts) == 5 and limited.videos == VIDS[:5]
    assert limited.text_video == [0, 1, 2, 3, 4]
    lim_test = load_split(_cfg("msrvtt", tmp_path, limit_eval=1), "test")
    assert lim_test.videos == [VIDS[8]] and lim_test.text_video == [0]
    lim_multi = load_split(_cfg("msrvtt", tmp_path, limit_eval=1), "test_multi")
    assert lim_multi.videos == [VIDS[8]] and len(lim_multi.texts) == 3  # a video keeps all its captions
    with pytest.raises(AnnotationError, match="val_fraction is 0"):
        load_split(_cfg("msrvtt", tmp_path, val_fraction=0.0), "val")


def test_msrvtt_val_picks_smallest_sen_id(tmp_path):
    truth = write_msrvtt(tmp_path, VIDS, 3, test_ids=VIDS[8:])
    data = json.loads((tmp_path / "MSRVTT_data.json").read_text())
    # renumber so that caption 2 of every video has the smallest sen_id although it comes last in the file
    for s in data["sentences"]:
        j = truth["captions"][s["video_id"]].index(s["caption"])
        s["sen_id"] = {0: 1000, 1: 2000, 2: 5}[j] + int(s["video_id"][5:])
    (tmp_path / "MSRVTT_data.json").write_text(json.dumps(data))
    val = load_split(_cfg("msrvtt", tmp_path, val_fraction=0.25), "val")
    assert val.texts == [truth["captions"][v][2] for v in val.videos]


def test_msrvtt_val_csv_is_the_official_validation_split(tmp_path):
    """A set that ships MSRVTT_val.csv (tvr synth with val_like_test) has a validation split built like its test:
    one given caption per video, read as is; its videos never reach training, whichever list holds them, and
    val_fraction no longer holds anything out."""
    truth = write_msrvtt(tmp_path, VIDS, 3, test_ids=VIDS[8:])
    chosen = {VIDS[1]: truth["captions"][VIDS[1]][2], VIDS[6]: truth["captions"][VIDS[6]][1]}
    rows = "".join(f"val{k},msr{k},{v},{c}\n" for k, (v, c) in enumerate(chosen.items()))
    (tmp_path / "MSRVTT_val.csv").write_text("key,vid_key,video_id,sentence\n" + rows)
    cfg = _cfg("msrvtt", tmp_path, val_fraction=0.25)
    val, train = load_split(cfg, "val"), load_split(cfg, "train")
    assert val.videos == list(chosen) and val.texts == list(chosen.values()) and val.protocol == "one_to_one"
    assert train.videos == [v for v in VIDS[:8] if v not in chosen] and len(train.texts) == 3 * 6
    assert describe_split_source(cfg)["splits"]["val"]["source"] == "official"
    (tmp_path / "MSRVTT_val.csv").write_text(f"key,vid_key,video_id,sentence\nval0,m,{VIDS[1]},a\nval1,m,{VIDS[1]},b\n")
    clear_cache()
    with pytest.raises(AnnotationError, match=r"MSRVTT_val.csv.*appears twice"):
        load_split(cfg, "val")


def test_held_out_videos_rule():
    ids = [f"v{k}" for k in range(200)]
    held = held_out_videos(ids, 0.1, 7)
    assert len(held) == 20 and held == [v for v in ids if v in set(held)]
    assert held_out_videos(list(reversed(ids)), 0.1, 7) == list(reversed(held))  # independent of file order
    assert held_out_videos(ids, 0.1, 8) != held
    assert held_out_videos(ids, 0.0, 7) == []
    assert len(held_out_videos(ids[:3], 0.01, 0)) == 1  # at least one
    with pytest.raises(AnnotationError, match="val_fraction"):
        held_out_videos(ids, 1.0, 0)


def test_msvd_fixture(tmp_path):
    truth = write_msvd(tmp_path, ["a1", "a2", "a3"], ["b1"], ["c1", "c2"], captions_per_video=[2, 3, 1])
    cfg = _cfg("msvd", tmp_path)
    train = load_split(cfg, "train")
    assert train.protocol == "multi_caption"
    assert train.texts == [c for v in ["a1", "a2", "a3"] for c in truth["captions"][v]]
    test = load_split(cfg, "test")
    assert test.protocol == "multi_caption" and test.videos == ["c1", "c2"]
    assert _groups(test) == {v: truth["captions"][v] for v in ["c1", "c2"]}
    _assert_contiguous(test)
    val = load_split(cfg, "val")
    assert val.videos == ["b1"] and describe_split_source(cfg)["splits"]["val"]["source"] == "official"
    assert len(load_split(_cfg("msvd", tmp_path, limit_eval=1), "test").videos) == 1


def test_msvd_refuses_pickles_that_import_code(tmp_path):
    write_msvd(tmp_path, ["a"], ["b"], ["c"])
    (tmp_path / "raw-captions.pkl").write_bytes(pickle.dumps({"a": [["x"]], "obj": Path("/")}))
    with pytest.raises(AnnotationError, match="raw-captions.pkl.*refusing"):
        load_split(_cfg("msvd", tmp_path), "train")


def test_msvd_decompression_bombs_are_refused_in_a_line(tmp_path):
    """A few kB of pickle can reference one list or one long word millions of times (24 GB of captions once
    joined): shared lists are refused, and the text a file may expand to is bounded, before anything is joined."""
    write_msvd(tmp_path, ["a"], ["b"], ["c"])
    words = ["word"] * 50
    caption = list(words)
    shared_lists = {f"v{k}": [caption] * 200 for k in range(200)} | {"a": [["x"]], "b": [["y"]], "c": [["z"]]}
    long_word = "w" * 100_000
    shared_word = {f"v{k}": [[long_word] * 100] for k in range(500)} | {"a": [["x"]], "b": [["y"]], "c": [["z"]]}
    long_caption = {"a": [["x"] * 5000], "b": [["y"]], "c": [["z"]]}
    for bomb, message in (
        (shared_lists, "referenced twice"),
        (shared_word, "more than .* characters of text"),
        (long_caption, "a caption of 5000 words"),
    ):
        data = pickle.dumps(bomb)
        assert len(data) < 300_000  # small on disk
        (tmp_path / "raw-captions.pkl").write_bytes(data)
        clear_cache()
        with pytest.raises(AnnotationError, match=f"raw-captions.pkl.*{message}"):
            load_split(_cfg("msvd", tmp_path), "train")


@pytest.mark.parametrize("layout", ["original", "jsonl"])
def test_didemo_fixture_layouts(tmp_path, layout):
    splits = {"train": ["t1", "t2", "t3"], "val": ["v1"], "test": ["x1", "x2"]}
    truth = write_didemo(tmp_path, splits, 3, layout=layout)
    cfg = _cfg("didemo", tmp_path)
    for name, ids in splits.items():
        split = load_split(cfg, name)
        assert split.protocol == "paragraph" and split.videos == ids
        assert split.texts == [" ".join(truth["captions"][v]) for v in ids]
        _assert_square(split)


@pytest.mark.parametrize("layout", ["original", "jsonl"])
def test_activitynet_fixture_layouts(tmp_path, layout):
    ids = [f"v_{k:03d}" for k in range(12)]
    truth = write_activitynet(tmp_path, {"train": ids[:10], "test": ids[10:]}, 3, layout=layout)
    cfg = _cfg("activitynet", tmp_path, val_fraction=0.2, val_seed=1)
    test = load_split(cfg, "test")
    assert test.videos == ids[10:]
    assert test.texts == [" ".join(truth["captions"][v]) for v in ids[10:]]  # leading spaces stripped
    held = held_out_videos(ids[:10], 0.2, 1)
    assert load_split(cfg, "val").videos == held
    assert load_split(cfg, "val").protocol == "paragraph"
    assert load_split(cfg, "train").videos == [v for v in ids[:10] if v not in held]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_generic_fixture(tmp_path, fmt):
    rows = [
        {"video": "a", "caption": "a cat", "split": "train"},
        {"video": "b", "caption": "a dog"},  # no split: train
        {"video": "a", "caption": "the cat again", "split": "train"},
        {"video": "c", "caption": "one", "split": "test"},
        {"video": "d", "caption": "two", "split": "test"},
        {"video": "e", "caption": "three", "split": "val"},
        {"video": "e", "caption": "three again", "split": "val"},
    ]
    path = write_generic(tmp_path, rows, fmt=fmt)
    cfg = _cfg("generic", tmp_path, generic_file=path.name)
    train = load_split(cfg, "train")
    assert train.texts == ["a cat", "a dog", "the cat again"] and train.videos == ["a", "b"]
    assert train.text_video == [0, 1, 0]
    test = load_split(cfg, "test")
    assert (test.protocol, test.videos, test.texts) == ("one_to_one", ["c", "d"], ["one", "two"])
    val = load_split(cfg, "val")
    assert (val.protocol, val.videos, val.texts) == ("multi_caption", ["e"], ["three", "three again"])


def test_generic_without_val_rows_holds_out_train_videos(tmp_path):
    rows = [{"video": f"v{k}", "caption": f"caption {k}"} for k in range(10)] + [
        {"video": "t", "caption": "test", "split": "test"}
    ]
    write_generic(tmp_path, rows)
    cfg = _cfg("generic", tmp_path, val_fraction=0.3)
    held = held_out_videos([f"v{k}" for k in range(10)], 0.3, 0)
    val = load_split(cfg, "val")
    assert val.videos == held and val.protocol == "one_to_one"
    assert not set(load_split(cfg, "train").videos) & set(held)
    assert describe_split_source(cfg)["splits"]["val"]["video_ids"] == held


# =============================================================================================== malformed


def test_bad_jsonl_line_is_named(tmp_path):
    write_didemo(tmp_path, {"train": ["a", "b"], "val": ["c"], "test": ["d"]}, layout="jsonl")
    lines = (tmp_path / "train.jsonl").read_text().split("\n")
    lines[1] = lines[1][:-3]
    (tmp_path / "train.jsonl").write_text("\n".join(lines))
    with pytest.raises(AnnotationError, match=r"train\.jsonl line 2: not valid JSON"):
        load_split(_cfg("didemo", tmp_path), "train")


def test_bad_json_file_line_is_named(tmp_path):
    write_msrvtt(tmp_path, VIDS, 2)
    text = json.dumps(json.loads((tmp_path / "MSRVTT_data.json").read_text()), indent=1)
    lines = text.split("\n")
    lines[5] = lines[5] + ","  # trailing comma → invalid JSON on line 6 or 7
    (tmp_path / "MSRVTT_data.json").write_text("\n".join(lines))
    with pytest.raises(AnnotationError, match=r"MSRVTT_data\.json line [67]: not valid JSON"):
        load_split(_cfg("msrvtt", tmp_path), "train")


def test_missing_column_is_named(tmp_path):
    write_msrvtt(tmp_path, VIDS, 2)
    (tmp_path / "MSRVTT_train.9k.csv").write_text("vid\nvideo0\n")
    with pytest.raises(AnnotationError, match=r"MSRVTT_train\.9k\.csv line 1: expected a 'video_id' column"):
        load_split(_cfg("msrvtt", tmp_path), "train")


def test_missing_field_is_named(tmp_path):
    write_activitynet(tmp_path, {"train": ["v_a", "v_b"], "test": ["v_c"]}, layout="jsonl")
    lines = (tmp_path / "val1.jsonl").read_text().split("\n")
    obj = json.loads(lines[0])
    del obj["text"]
    (tmp_path / "val1.jsonl").write_text(json.dumps(obj) + "\n")
    with pytest.raises(AnnotationError, match=r"val1\.jsonl line 1 field 'text': expected a non-empty list"):
        load_split(_cfg("activitynet", tmp_path), "test")


def test_missing_json_field_path_is_named(tmp_path):
    write_msrvtt(tmp_path, VIDS, 2)
    data = json.loads((tmp_path / "MSRVTT_data.json").read_text())
    data["sentences"][4]["caption"] = None
    (tmp_path / "MSRVTT_data.json").write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=r"field 'sentences\[4\]\.caption'"):
        load_split(_cfg("msrvtt", tmp_path), "train")


def test_unknown_video_in_split_list(tmp_path):
    write_msrvtt(tmp_path, VIDS, 2)
    with (tmp_path / "MSRVTT_train.9k.csv").open("a") as handle:
        handle.write("video123\n")
    with pytest.raises(AnnotationError, match=r"MSRVTT_train\.9k\.csv line 10: video 'video123' is not in"):
        load_split(_cfg("msrvtt", tmp_path), "train")
    write_msvd(tmp_path / "msvd", ["a"], ["b"], ["c"])
    (tmp_path / "msvd" / "test_list.txt").write_text("c\nzzz\n")
    with pytest.raises(AnnotationError, match=r"test_list\.txt line 2: video 'zzz' is not in raw-captions\.pkl"):
        load_split(_cfg("msvd", tmp_path / "msvd"), "test")


def test_empty_and_missing_files(tmp_path):
    write_didemo(tmp_path, {"train": ["a"], "val": ["b"], "test": ["c"]}, layout="jsonl")
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(AnnotationError, match=r"test\.jsonl: file is empty"):
        load_split(_cfg("didemo", tmp_path), "test")
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(AnnotationError, match=r"expected one of \['test_data\.json', 'test\.jsonl'\]"):
        load_split(_cfg("didemo", empty), "test")
    with pytest.raises(AnnotationError, match="MSRVTT_data.json"):
        load_split(_cfg("msrvtt", empty), "train")
    with pytest.raises(AnnotationError, match="annotation folder not found"):
        load_split(_cfg("msrvtt", tmp_path / "absent"), "test")
    with pytest.raises(AnnotationError, match="data.dataset must be one of"):
        load_split(_cfg("kinetics", tmp_path), "test")
    with pytest.raises(AnnotationError, match="split must be one of"):
        load_split(_cfg("didemo", tmp_path), "dev")


def test_generic_bad_rows(tmp_path):
    write_generic(tmp_path, [{"video": "a", "caption": "x", "split": "training"}])
    with pytest.raises(AnnotationError, match=r"captions\.csv line 2 field 'split'"):
        load_split(_cfg("generic", tmp_path), "train")
    write_generic(tmp_path, [{"video": "a", "caption": "x"}, {"video": "a", "caption": "y", "split": "test"}])
    with pytest.raises(AnnotationError, match=r"line 3: video 'a' is in split 'test' here but in 'train' on line 2"):
        load_split(_cfg("generic", tmp_path), "train")
    write_generic(tmp_path, [{"video": "a", "caption": ""}])
    with pytest.raises(AnnotationError, match=r"line 2 field 'caption': empty string"):
        load_split(_cfg("generic", tmp_path), "train")
    write_generic(tmp_path, [{"video": "a", "caption": "x"}], fmt="jsonl", name="mine")
    with pytest.raises(AnnotationError, match=r"mine\.jsonl: no rows with split='test'"):
        load_split(_cfg("generic", tmp_path, generic_file="mine.jsonl"), "test")


def test_generic_file_messages_say_what_is_wrong(tmp_path):
    """A caption over the CSV reader's 128 KiB field limit is named as such (with the line it starts on), not as
    invalid CSV; a folder given as data.generic_file is a folder, not a missing file."""
    (tmp_path / "captions.csv").write_text(
        "video,caption\na.mp4,a short caption\nb.mp4," + "w" * 140_000 + "\nc.mp4,another\n"
    )
    with pytest.raises(AnnotationError, match=r"captions\.csv line 3: a field longer than 131,072 characters") as info:
        load_split(_cfg("generic", tmp_path), "train")
    assert "not valid CSV" not in str(info.value) and "unclosed quote" in str(info.value)
    clear_cache()
    (tmp_path / "captions.csv").write_text('video,caption\na.mp4,"an unclosed quote\n' + "b.mp4,x\n" * 20_000)
    with pytest.raises(AnnotationError, match=r"captions\.csv line 2: a field longer than"):
        load_split(_cfg("generic", tmp_path), "train")
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(AnnotationError, match=r"folder\.csv: is a folder; the generic format needs data.generic_file"):
        load_split(_cfg("generic", tmp_path, generic_file="folder.csv"), "train")
    with pytest.raises(AnnotationError, match=r"absent\.csv: file not found"):
        load_split(_cfg("generic", tmp_path, generic_file="absent.csv"), "train")
