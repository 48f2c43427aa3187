"""Every JSON / YAML file tvr reads goes through one bounded reader (tvr/utils/data_files.py): a file nested
thousands deep, a YAML alias bomb, a file too large or a FIFO is one line naming the file and exit 2 — in every kind
of file, where each used to end in a RecursionError traceback."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_end_to_end import make_msrvtt
from typer.testing import CliRunner

from tvr.cli import app
from tvr.utils.data_files import (
    MAX_DEPTH,
    DataFileError,
    parse_json,
    parse_yaml,
    read_json,
    read_jsonl,
    read_yaml,
)

runner = CliRunner()
DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_YAML = "data: " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP = "nested more than 100 levels deep"

# --------------------------------------------------------------------------------------------- the reader


def test_json_is_bounded_in_depth_whatever_the_parser_would_take() -> None:
    nested = lambda n: "[" * n + "]" * n  # noqa: E731
    assert parse_json(nested(MAX_DEPTH), "x.json") is not None
    for depth in (MAX_DEPTH + 1, 900, 100_000):  # 900: json.loads parses it, the code walking it would overflow
        with pytest.raises(DataFileError, match=rf"^x\.json: {DEEP}"):
            parse_json(nested(depth), "x.json")
    objects = '{"a": ' * 150 + "1" + "}" * 150
    with pytest.raises(DataFileError, match=DEEP):
        parse_json(objects, "x.json")
    with pytest.raises(DataFileError, match=r"^x\.json:3: not valid JSON \(Expecting value, column 7\)$"):
        parse_json('{\n "a": 1,\n "b": }', "x.json")


def test_yaml_is_bounded_in_depth_and_in_what_its_aliases_expand_to() -> None:
    assert parse_yaml("a: &x {b: 1}\nc: *x\nd: {<<: *x, e: 2}", "c.yaml") == {
        "a": {"b": 1},
        "c": {"b": 1},
        "d": {"b": 1, "e": 2},
    }
    block = "".join("  " * k + f"k{k}:\n" for k in range(150)) + "  " * 150 + "v"
    for text in (DEEP_YAML, "a: " + "[" * 1_000_000, block):
        with pytest.raises(DataFileError, match=rf"^c\.yaml:\d+: {DEEP}"):
            parse_yaml(text, "c.yaml")
    # an alias stands for the node it names: 60 levels inside 60 levels is 120 levels
    deep_alias = "a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 60 + "*a" + "]" * 60
    with pytest.raises(DataFileError, match=DEEP):
        parse_yaml(deep_alias, "c.yaml")
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + k)}: &{chr(98 + k)} [{', '.join([f'*{chr(97 + k)}'] * 10)}]\n" for k in range(9)
    )  # 10^10 strings once expanded
    with pytest.raises(DataFileError, match="aliases that expand to more than 1,000,000 values"):
        parse_yaml(laughs, "c.yaml")
    unclosed = r"^c\.yaml:2: not valid YAML: .* \(while parsing a flow sequence on line 1: data: \[unclosed\)$"
    with pytest.raises(DataFileError, match=unclosed):
        parse_yaml("data: [unclosed\n", "c.yaml")
    with pytest.raises(DataFileError, match="could not determine a constructor"):
        parse_yaml("a: !!python/object/apply:os.system [echo hi]", "c.yaml")


def test_files_are_regular_bounded_and_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    assert len(read_json(big)) == 601
    with pytest.raises(DataFileError, match=r"big\.json: 1,203 bytes, more than the 1,000 a file of this kind may"):
        read_json(big, max_bytes=1000)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(DataFileError, match=r"fifo\.yaml: a FIFO, not a regular file"):
        read_yaml(fifo)  # refused, never waited on
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{\n"a": "caf\xe9"}')
    with pytest.raises(DataFileError, match=r"latin\.json:2: not UTF-8 text"):
        read_json(latin)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")


def test_a_log_keeps_ignoring_only_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(log) == [{"step": 1}, {"step": 2}]
    log.write_text('{"step": 1}\n' + DEEP_JSON + "\n")  # a deep last line is not a torn one
    with pytest.raises(DataFileError, match=rf"log\.jsonl:2: {DEEP}"):
        read_jsonl(log)


# --------------------------------------------------------------------------------------------- every kind of file


@pytest.fixture(scope="module")
def made(search_index: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One of everything a command reads back: a run folder, a feature cache, a prepared folder, a frame cache and
    a search index (the session's)."""
    root = tmp_path_factory.mktemp("data-files")
    values = make_msrvtt(root / "data")
    values["train"]["max_steps"] = 1
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    videos = str(root / "data" / "videos")
    for args in (
        ["train", "-c", str(config), "-o", str(root / "run"), "--no-test"],
        ["features", "-c", str(config), "-o", str(root / "cache")],
        ["prepare", "videos", videos, str(root / "prepared")],
        ["prepare", "frames", videos, str(root / "frames"), "--max-frames", "4"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return {"root": root, "config": config, "index": search_index, "videos": Path(videos)}


def _copy(made: dict[str, Path], name: str, work: Path) -> Path:
    source = made[name] if name in made else made["root"] / name
    return Path(shutil.copytree(source, work / name))


def _config_with(made: dict[str, Path], work: Path, change: Callable[[dict], None]) -> Path:
    values = yaml.safe_load(made["config"].read_text())
    change(values)
    path = work / "changed.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _index_file(name: str):
    def setup(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
        index = _copy(made, "index", work)
        path = next(index.glob(name))
        path.write_text(DEEP_JSON)
        return ["search", str(index), "a red screen"], path

    return setup


def _run_file(name: str, content: str, command: str = "resume"):
    def setup(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
        run = _copy(made, "run", work)
        (run / name).write_text(content)
        if command == "plot":
            return ["plot", str(run), "-o", str(work / "plot.png")], run / name
        args = ["train", "-c", str(made["config"]), "-o", str(run), "--resume", "--set", "train.max_steps=2"]
        return args, run / name

    return setup


def _features(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    cache = _copy(made, "cache", work)
    (cache / "manifest.json").write_text(DEEP_JSON)
    return ["features", "-c", str(made["config"]), "-o", str(cache)], cache / "manifest.json"


def _prepared(kind: str):
    def setup(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
        folder = _copy(made, "prepared" if kind == "videos" else "frames", work)
        manifest = next(folder.glob("*manifest.json"))
        manifest.write_text(DEEP_JSON)
        extra = ["--max-frames", "4"] if kind == "frames" else []
        return ["prepare", kind, str(made["videos"]), str(folder), *extra], manifest

    return setup


def _config(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    path = work / "deep.yaml"
    path.write_text(DEEP_YAML)
    return ["train", "-c", str(path), "-o", str(work / "run")], path


def _annotations(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    data = Path(shutil.copytree(made["root"] / "data", work / "data", symlinks=True))
    (data / "MSRVTT_data.json").write_text(DEEP_JSON)
    config = _config_with(made, work, lambda v: v["data"].update(annotations=str(data), video_dir=str(data / "videos")))
    return ["train", "-c", str(config), "-o", str(work / "run")], data / "MSRVTT_data.json"


def _tokenizer(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    from tvr.data.tokenizer import build_tiny_tokenizer_files

    folder = work / "tokenizer"
    build_tiny_tokenizer_files(folder)
    (folder / "vocab.json").write_text(DEEP_JSON)
    config = _config_with(made, work, lambda v: v["model"].update(tokenizer=str(folder)))
    return ["train", "-c", str(config), "-o", str(work / "run")], folder / "vocab.json"


def _hf_config(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    from transformers import CLIPModel

    from tvr.data.tokenizer import build_tiny_tokenizer_files
    from tvr.models.backbones.clip.config import TinyClipConfig
    from tvr.models.backbones.clip.files import save_clip_atomic
    from tvr.models.backbones.clip.modeling import tiny_clip_config

    tiny = yaml.safe_load(made["config"].read_text())["model"]["tiny"]
    folder = save_clip_atomic(CLIPModel(tiny_clip_config(TinyClipConfig(**tiny))), work / "hf")
    build_tiny_tokenizer_files(folder)
    (folder / "config.json").write_text(DEEP_JSON)
    config = _config_with(made, work, lambda v: v["model"].update(clip=str(folder), tokenizer=""))
    return ["train", "-c", str(config), "-o", str(work / "run")], folder / "config.json"


def _bench_record(option: str):
    def setup(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
        committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "bench_default.json"
        results, deep, template = work / "results.json", work / "deep.json", work / "t.md"
        shutil.copy(committed, results)
        deep.write_text(DEEP_JSON)
        template.write_text("{{default.name}}\n")
        args = ["bench", "report", "--template", str(template), "--out", str(work / "doc.md")]
        if option == "--results":
            return [*args, "--results", str(deep)], deep
        value = f"power={deep}" if option == "--source" else str(deep)
        return [*args, "--results", str(results), option, value], deep

    return setup


def _bench_config(made: dict[str, Path], work: Path) -> tuple[list[str], Path]:
    path = work / "bench.yaml"
    path.write_text(DEEP_YAML)
    return ["bench", "-c", str(path), "-o", str(work / "bench")], path


KINDS = {
    "index manifest": _index_file("manifest.json"),
    "index settings": _index_file("settings.json"),
    "shard meta": _index_file("shards/*/meta.json"),
    "feature-cache manifest": _features,
    "prepare manifest": _prepared("videos"),
    "frame-cache manifest": _prepared("frames"),
    "config": _config,
    "run config.yaml": _run_file("config.yaml", DEEP_YAML),
    "training log (resume)": _run_file("train_log.jsonl", DEEP_JSON + "\n{}\n"),
    "training log (plot)": _run_file("train_log.jsonl", DEEP_JSON + "\n{}\n", command="plot"),
    "annotations": _annotations,
    "tokenizer": _tokenizer,
    "HF config": _hf_config,
    "bench results": _bench_record("--results"),
    "bench sweep": _bench_record("--sweep"),
    "bench --source": _bench_record("--source"),
    "bench config": _bench_config,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_deeply_nested_file_of_every_kind_is_one_line_and_exit_2(made: dict, kind: str, tmp_path: Path) -> None:
    args, path = KINDS[kind](made, tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith(("error:", "config error:"))]
    assert len(errors) == 1 and str(path) in errors[0] and DEEP in errors[0], result.output


def test_an_override_or_a_lock_file_nested_deep_is_refused_or_ignored(made: dict, tmp_path: Path) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    result = runner.invoke(app, ["train", "-c", str(made["config"]), "-o", str(tmp_path / "r"), "--set", f"a={deep}"])
    assert result.exit_code == 2 and "override 'a=[[[" in result.output and DEEP in result.output
    run = _copy(made, "run", tmp_path)
    (run / ".tvr.lock").write_text(DEEP_JSON)  # whoever held it left this: it only says who held the folder
    result = runner.invoke(app, ["train", "-c", str(made["config"]), "-o", str(run), "--resume", "--no-test",
                                 "--set", "train.max_steps=2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


#: calls that parse JSON / YAML outside the reader, and why each may: text that never came from a file
PARSED_ELSEWHERE = {
    "tvr/bench/runs.py": 3,  # the bench's messages to and from its own worker processes, over a pipe
    "tvr/bench/records.py": 1,  # sealed(): a record tvr built, round-tripped to plain JSON types
}


def test_every_json_and_yaml_file_is_read_through_the_bounded_reader() -> None:
    import ast

    root = Path(__file__).resolve().parents[1]
    parsers = {("json", "loads"), ("json", "load"), ("yaml", "safe_load"), ("yaml", "load"), ("yaml", "full_load")}
    found: dict[str, int] = {}
    for path in sorted((root / "tvr").rglob("*.py")):
        relative = str(path.relative_to(root))
        if relative == "tvr/utils/data_files.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in parsers:
                    found[relative] = found.get(relative, 0) + 1
    assert found == PARSED_ELSEWHERE
