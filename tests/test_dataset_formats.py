"""Dataset formats are registered readers: tvr's five are found as modules of ``tvr.data.formats`` with no list, and a
format defined here, outside ``tvr``, is read, held out, described and checked with no edit in ``tvr/``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from tvr.config import ConfigError, DataConfig, load_config
from tvr.data.annotations import AnnotationError, describe_split_source, load_split
from tvr.data.formats.base import DatasetFormat, SplitPart, evaluation_protocol
from tvr.data.formats.reading import annotation_error, read_text
from tvr.data.formats.registry import (
    available_dataset_formats,
    builtin_dataset_formats,
    dataset_format,
    register_dataset_format,
)
from tvr.pipeline import resolve_config

PACKAGE = Path(__file__).resolve().parents[1] / "tvr"
TOY_FILE = "pairs.tsv"


@register_dataset_format("toy_tsv")
class ToyTsv(DatasetFormat):
    """``pairs.tsv``: one ``split<TAB>video<TAB>caption`` a line; no val rows, so validation is held out."""

    def pairs_file(self, folder: Path, cfg: DataConfig) -> Path:
        return folder / TOY_FILE

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        path = self.pairs_file(folder, cfg)
        pairs = []
        for number, line in enumerate(read_text(path, "split<TAB>video<TAB>caption lines").splitlines(), start=1):
            fields = line.split("\t")
            if len(fields) != 3:
                raise annotation_error(path, f"expected 3 tab-separated fields, found {len(fields)}", number)
            if fields[0] == split:
                pairs.append((fields[1], fields[2]))
        if not pairs:
            return None if split == "val" else SplitPart([], [], "one_to_one", [path.name])
        part = SplitPart(pairs, list(dict.fromkeys(v for v, _ in pairs)), "multi_caption", [path.name])
        part.protocol = evaluation_protocol(part)
        return part


def _toy_folder(tmp_path: Path) -> Path:
    lines = [f"train\tv{k}\ta caption of video {k}\ntrain\tv{k}\tanother caption of {k}" for k in range(10)]
    lines += [f"test\tt{k}\tthe test caption {k}" for k in range(3)]
    (tmp_path / TOY_FILE).write_text("\n".join(lines) + "\n")
    return tmp_path


def test_the_built_in_formats_are_found_without_a_list() -> None:
    assert builtin_dataset_formats() == ["activitynet", "didemo", "generic", "msrvtt", "msvd"]
    assert {"toy_tsv", *builtin_dataset_formats()} <= set(available_dataset_formats())
    assert [f.name for f in dataclasses.fields(dataset_format("msrvtt").Settings)] == ["train_split"]
    assert dataset_format("msrvtt").extra_splits
    with pytest.raises(AnnotationError, match="data.dataset must be one of"):
        dataset_format("kinetics")


def test_a_format_outside_tvr_is_read_held_out_and_described(tmp_path: Path) -> None:
    folder = _toy_folder(tmp_path)
    cfg = load_config(None, ["data.dataset=toy_tsv", f"data.annotations={folder}", "data.val_fraction=0.2"]).data
    train, val, test = (load_split(cfg, split) for split in ("train", "val", "test"))
    assert (train.num_videos, val.num_videos) == (8, 2) and not set(train.videos) & set(val.videos)
    assert val.protocol == "multi_caption" and val.num_texts == 4  # the default hold-out keeps every caption
    assert (test.protocol, test.texts) == ("one_to_one", [f"the test caption {k}" for k in range(3)])
    assert test.name == "toy_tsv/test"
    described = describe_split_source(cfg)
    assert described["dataset"] == "toy_tsv" and described["splits"]["val"]["source"] == "held_out_from_train"
    with pytest.raises(AnnotationError, match="does not exist for toy_tsv"):
        load_split(cfg, "test_multi")
    (folder / TOY_FILE).write_text("train\tonly two\n")
    with pytest.raises(AnnotationError, match=r"pairs.tsv line 1: expected 3 tab-separated fields"):
        load_split(cfg, "train")


@dataclasses.dataclass
class NamedTsvSettings:
    """What only the ``toy_tsv_named`` format reads: ``data.tsv_file``."""

    #: the pairs file, relative to ``data.annotations``
    tsv_file: str = TOY_FILE


@register_dataset_format("toy_tsv_named")
class NamedTsv(ToyTsv):
    """``toy_tsv`` reading the file its own setting, ``data.tsv_file``, names."""

    Settings = NamedTsvSettings

    def pairs_file(self, folder: Path, cfg: DataConfig) -> Path:
        return folder / self.settings(cfg).tsv_file


def test_a_format_outside_tvr_declares_settings_of_its_own(tmp_path: Path) -> None:
    """A format names its own ``data.<key>`` settings as msrvtt (``train_split``) and generic (``generic_file``) do:
    read, typed when the run is resolved, recorded in the run's split description, checked; a run on another format
    does not record them, and a key no format declares is one line naming the valid ones."""
    folder = _toy_folder(tmp_path)
    (folder / "mine.tsv").write_text("train\tm0\tmine\ntest\tm1\tmine too\n")
    chosen = [
        "data.dataset=toy_tsv_named",
        f"data.annotations={folder}",
        "data.tsv_file=mine.tsv",
        "data.val_fraction=0",
    ]
    cfg = resolve_config(load_config(None, chosen)).data
    assert cfg.tsv_file == "mine.tsv" and load_split(cfg, "test").texts == ["mine too"]
    assert describe_split_source(cfg)["tsv_file"] == "mine.tsv"
    assert load_split(load_config(None, chosen).data, "test").texts == ["mine too"]  # unresolved: read the same
    msrvtt = resolve_config(load_config(None, [])).data
    assert "tsv_file" not in msrvtt.declared and set(msrvtt.declared) == {"generic_file", "train_split"}
    with pytest.raises(ConfigError, match=r"data: unknown key\(s\) \['tsv_fil'\]; valid keys: \[.*'tsv_file'"):
        resolve_config(load_config(None, ["data.dataset=toy_tsv_named", "data.tsv_fil=x"]))
    with pytest.raises(ConfigError, match=r"data\.train_split = '8k': expected one of \['9k', '7k'\]"):
        resolve_config(load_config(None, ["data.train_split=8k"]))
    with pytest.raises(ValueError, match=r"data\.train_split is already declared otherwise"):

        @register_dataset_format("toy_tsv_clash")
        class Clash(ToyTsv):
            Settings = ClashSettings


@dataclasses.dataclass
class ClashSettings:
    """Declares msrvtt's ``data.train_split`` otherwise."""

    train_split: int = 9


@register_dataset_format("toy_tsv_extra")
class ToyTsvExtra(ToyTsv):
    """The toy format with an extra split of its own, ``test_short`` (the test rows again), declared, not listed."""

    extra_splits = ("test_short",)

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        return super().read(folder, cfg, "test" if split == "test_short" else split)


def test_a_formats_own_extra_split_is_known_everywhere_splits_are_named(tmp_path: Path) -> None:
    from tvr.data.annotations import evaluation_splits, extra_splits, known_splits
    from tvr.pipeline import resolve_config

    assert {"test_multi", "test_short"} <= set(extra_splits()) and "test_short" in known_splits()
    assert evaluation_splits()[:2] == ("val", "test") and evaluation_splits()[-1] == "train"
    folder = _toy_folder(tmp_path)
    cfg = resolve_config(
        load_config(None, ["data.dataset=toy_tsv_extra", f"data.annotations={folder}", "eval.split=test_short"])
    )
    assert load_split(cfg.data, "test_short").texts == load_split(cfg.data, "test").texts
    with pytest.raises(AnnotationError, match="split 'test_short' does not exist for toy_tsv "):
        load_split(load_config(None, ["data.dataset=toy_tsv", f"data.annotations={folder}"]).data, "test_short")
    with pytest.raises(ConfigError, match=r"eval.split = 'nosuch': expected one of \['val', 'test', "):
        resolve_config(load_config(None, ["eval.split=nosuch"]))


class PluggedTsv(ToyTsv):
    """The toy format as an installed package would contribute it: through an entry point, never imported here."""


def test_formats_of_installed_packages_join_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from tvr.data.formats import registry

    group = registry.ENTRY_POINT_GROUP
    good = importlib.metadata.EntryPoint("plugged_tsv", "test_dataset_formats:PluggedTsv", group)
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:Format", group)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [good, broken])
    monkeypatch.setattr(registry._FORMATS, "_discovered", False)
    try:
        assert "plugged_tsv" in available_dataset_formats() and "broken" not in available_dataset_formats()
        assert dataset_format("plugged_tsv").name == "plugged_tsv" and ToyTsv.name == "toy_tsv"
        from tvr.pipeline import resolve_config

        assert resolve_config(load_config(None, ["data.dataset=plugged_tsv"])).data.dataset == "plugged_tsv"
    finally:
        registry._FORMATS._classes.pop("plugged_tsv", None)


class PathTsv(ToyTsv):
    """The toy format named by import path (``data.dataset: test_dataset_formats:PathTsv``), registered by no one."""


def test_a_format_by_import_path_needs_trusted_code(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tvr.cli import app
    from tvr.config import trusting_code
    from tvr.pipeline import resolve_config

    spec = "test_dataset_formats:PathTsv"
    with pytest.raises(ConfigError, match=r"data.dataset = 'test_dataset_formats:PathTsv' is an import path"):
        load_config(None, [f"data.dataset={spec}"])
    folder = _toy_folder(tmp_path)
    with trusting_code():
        cfg = resolve_config(load_config(None, [f"data.dataset={spec}", f"data.annotations={folder}"]))
        same = load_config(None, ["data.dataset=toy_tsv", f"data.annotations={folder}"]).data
        assert cfg.data.dataset == spec and load_split(cfg.data, "train").videos == load_split(same, "train").videos
        assert load_split(cfg.data, "test").name == f"{spec}/test" and spec in available_dataset_formats()
        for bad, message in (
            ("test_dataset_formats:ConfigError", "expected a DatasetFormat subclass"),
            ("no_such_module_xyz:Format", "cannot import module 'no_such_module_xyz'"),
        ):
            with pytest.raises(ConfigError, match=message):
                resolve_config(load_config(None, [f"data.dataset={bad}"]))
    refused = CliRunner().invoke(app, ["check-data", "--config", "cpu/clip4clip", "--set", f"data.dataset={spec}"])
    assert refused.exit_code == 2 and "tvr --trust-code" in refused.output


def test_data_dataset_is_checked_when_the_run_is_resolved(tmp_path: Path) -> None:
    """As ``head.name`` and ``model.backbone``: the config layer keeps the name, resolving the run checks it against
    the formats registered (tvr's own modules, and this file's ``toy_tsv``), before anything runs."""
    from typer.testing import CliRunner

    from tvr.cli import app
    from tvr.pipeline import resolve_config

    loaded = load_config(None, ["data.dataset=kinetics"])
    assert loaded.data.dataset == "kinetics"
    known = r"\['activitynet', 'didemo', 'generic', 'msrvtt', 'msvd', .*'toy_tsv'"
    with pytest.raises(ConfigError, match=rf"data.dataset = 'kinetics': expected one of {known}"):
        resolve_config(loaded)
    assert resolve_config(load_config(None, ["data.dataset=toy_tsv"])).data.dataset == "toy_tsv"
    result = CliRunner().invoke(app, ["check-data", "--config", "cpu/clip4clip", "--set", "data.dataset=kinetics"])
    assert result.exit_code == 2
    assert "--set data.dataset=kinetics: data.dataset = 'kinetics': expected one of ['activitynet'" in result.output


def test_register_dataset_format_refuses_a_taken_name_and_a_non_format() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_dataset_format("msvd")(ToyTsv)
    with pytest.raises(TypeError, match="DatasetFormat subclass"):
        register_dataset_format("not_a_format")(dict)


def _strings(node: ast.AST) -> set[str]:
    return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def _nodes_outside_the_formats():
    """(file, node) for every AST node of every tvr module outside tvr/data/formats/."""
    formats = PACKAGE / "data" / "formats"
    files = [path for path in sorted(PACKAGE.rglob("*.py")) if formats not in path.parents]
    return [
        (path.relative_to(PACKAGE.parent), node) for path in files for node in ast.walk(ast.parse(path.read_text()))
    ]


def test_no_module_outside_the_formats_compares_dataset_names_or_keeps_a_table_of_them() -> None:
    names = set(builtin_dataset_formats())

    def names_a_dataset(node: ast.AST) -> bool:
        if isinstance(node, ast.Compare):  # data.dataset == "msrvtt"
            return "dataset" in ast.unparse(node) and bool(_strings(node) & names)
        return isinstance(node, ast.Dict) and len(_strings(ast.Tuple(elts=node.keys)) & names) > 1  # a table

    found = [
        f"{where}:{node.lineno}: {ast.unparse(node)[:80]}"
        for where, node in _nodes_outside_the_formats()
        if names_a_dataset(node)
    ]
    assert not found, f"dataset names compared or tabled outside tvr/data/formats/: {found}"


def test_each_format_declares_its_test_protocol() -> None:
    from tvr.eval.protocol import default_protocol

    assert {name: dataset_format(name).protocol for name in builtin_dataset_formats()} == {
        "activitynet": "paragraph",
        "didemo": "paragraph",
        "generic": None,  # the files decide: one caption per video or several
        "msrvtt": "one_to_one",
        "msvd": "multi_caption",
    }
    assert default_protocol("msrvtt") == "one_to_one"
