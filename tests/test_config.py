"""Config schema: presets load, overrides apply with types, mistakes are named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tvr.config as config_mod
from tvr.config import Config, ConfigError, config_from_dict, load_config, save_config

PACKAGE = Path(__file__).resolve().parents[1] / "tvr"
CONFIGS = PACKAGE / "configs"
#: every run preset file by its name, found on disk: cpu/ in tvr/configs (tvr/configs/bench/ holds tvr bench
#: configs, tested in tests/test_bench.py), a method's in tvr/methods/<method>/presets/, a backbone's in
#: tvr/models/backbones/<backbone>/presets/
PRESET_FOLDERS = [
    *(d for d in CONFIGS.iterdir() if d.is_dir() and d.name != "bench"),
    *(PACKAGE / "methods").glob("*/presets"),
    *(PACKAGE / "models" / "backbones").glob("*/presets"),
]
PRESET_FILES = {
    f"{(f.parent if f.name == 'presets' else f).name}/{p.relative_to(f).with_suffix('').as_posix()}": p
    for f in PRESET_FOLDERS
    for p in f.rglob("*.yaml")
}


@pytest.mark.parametrize("preset", sorted(PRESET_FILES))
def test_every_preset_loads(preset: str) -> None:
    cfg = load_config(PRESET_FILES[preset])
    assert isinstance(cfg, Config)
    assert cfg.data.max_frames > 0 and cfg.data.max_words > 2


def test_base_chain_and_overrides_are_applied_in_order() -> None:
    cfg = load_config(PRESET_FILES["clip4clip/didemo"], ["train.lr=3e-4", "data.max_frames=16", "train.amp=false"])
    assert cfg.data.dataset == "didemo"  # from the child
    assert cfg.model.temporal == "seqTransf"  # inherited from the base
    assert cfg.train.lr == pytest.approx(3e-4)  # "3e-4" is a string in YAML 1.1; coerced
    assert cfg.data.max_frames == 16 and cfg.train.amp is False


def test_a_base_is_a_file_beside_it_or_a_shipped_preset_by_name(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: proxy/msrvtt\ndata:\n  max_words: 20\n")
    cfg, shipped = load_config(mine), load_config("proxy/msrvtt")
    assert cfg.data.max_words == 20 and (cfg.head, cfg.model, cfg.train) == (shipped.head, shipped.model, shipped.train)
    # the shipped proxy preset builds on the CLIP-ViP backbone's preset (base: clipvip/msrvtt), in another folder
    assert shipped.train.lr == load_config("clipvip/msrvtt").train.lr
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "msrvtt").write_text("train:\n  epochs: 7\n")  # a file beside it wins over the name
    assert load_config(mine).train.epochs == 7 != shipped.train.epochs
    mine.write_text("base: nosuch/preset\n")
    with pytest.raises(
        ConfigError, match=r"mine.yaml: base: 'nosuch/preset' is neither a file beside it nor a shipped"
    ):
        load_config(mine)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*train.*learning_rate"):
        load_config(bad)


def test_wrong_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.max_frames: expected an integer"):
        load_config(None, ["data.max_frames=twelve"])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["train.lr"])


def test_circular_base_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        load_config(tmp_path / "a.yaml")


def test_saved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(PRESET_FILES["gare/msrvtt"], ["head.options.eta=-1", "train.betas=[0.8, 0.9]"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg and again.head.options["eta"] == -1
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["betas"] == [0.8, 0.9]


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.schedule=cosine", r"train.schedule = 'cosine': expected one of \['warmup_cosine', 'constant'\]"),
        ("eval.tie_mode=pessimistic", r"eval.tie_mode = 'pessimistic': expected one of \['optimistic', 'reference'\]"),
        ("model.temporal=lstm", r"model.temporal = 'lstm': expected one of \['meanP', 'seqTransf', 'none'\]"),
        ("data.sampling=random", r"data.sampling = 'random': expected one of \['clip4clip', 'clipvip'\]"),
        ("train.select_metric=t2v/R2", r"train.select_metric = 't2v/R2': expected one of \['t2v/R1', "),
        ("data.val_fraction=1.0", r"data.val_fraction = 1.0: expected a number >= 0.0 and < 1.0"),
        ("train.lr=0", r"train.lr = 0.0: expected a number > 0.0"),
        ("train.warmup=-0.1", r"train.warmup = -0.1: expected a number >= 0.0 and < 1.0"),
        ("eval.rerank_k=-5", r"eval.rerank_k = -5: expected a number >= 0"),
        ("train.betas=[0.9, 1.5]", r"train.betas\[1\] = 1.5: expected a number >= 0 and < 1"),
        ("train.device=gpu", r"train.device = 'gpu': expected auto, cpu, cuda or cuda:N"),
        ("train.select_metric=t2v_dsl/R1", r"train.select_metric = 't2v_dsl/R1' needs eval.dsl = true"),
    ],
)
def test_choices_and_ranges_fail_at_load_with_the_valid_values(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(PRESET_FILES["clip4clip/msrvtt"], [override])


def test_choice_lists_match_the_implementations() -> None:
    from tvr.data.video import SAMPLING_MODES
    from tvr.eval.metrics import METRIC_KEYS, TIE_MODES
    from tvr.models.temporal import TEMPORAL_MODULES
    from tvr.train.schedule import SCHEDULES

    assert config_mod.SAMPLINGS == SAMPLING_MODES
    assert config_mod.TIE_MODES == TIE_MODES
    assert config_mod.SCHEDULES == SCHEDULES
    assert config_mod.METRIC_NAMES == METRIC_KEYS
    assert set(config_mod.TEMPORALS) == set(TEMPORAL_MODULES)


def test_switching_the_head_drops_the_previous_heads_options(tmp_path: Path) -> None:
    gare = PRESET_FILES["gare/msrvtt"]
    for overrides in (
        ["head.name=clip4clip", "head.options.video_pool=mean"],
        ["head.options.video_pool=mean", "head.name=clip4clip"],
    ):
        cfg = load_config(gare, overrides)
        assert cfg.head.name == "clip4clip" and cfg.head.options == {"video_pool": "mean"}
    kept = load_config(gare, ["head.name=gare"])  # same head: options stay
    assert kept.head.options["pool_temperature"] == 3.0
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {gare}\nhead:\n  name: clip4clip\n  options:\n    video_pool: text_softmax\n")
    assert load_config(child).head.options == {"video_pool": "text_softmax"}


def test_old_head_sections_are_migrated_by_config_loading_itself(caplog: pytest.LogCaptureFixture) -> None:
    """The migration of head.<name> sections runs from config_from_dict (so load_config and checkpoint configs), not
    as a side effect of importing the head registry: in a fresh process that imports only tvr.config it works."""
    assert config_mod.migrate_legacy_head_sections in config_mod._MIGRATIONS
    old = {"head": {"name": "gare", "gare": {"eta": -1.0, "rerank_k": 50}, "clip4clip": {"video_pool": "mean"}}}
    cfg = config_from_dict(old)
    assert cfg.head.options == {"eta": -1.0} and cfg.eval.rerank_k == 50
    assert "head.options" in caplog.text
    probe = (
        "import sys; from tvr.config import config_from_dict; "
        "cfg = config_from_dict({'head': {'name': 'gare', 'gare': {'eta': -1.0}}}); "
        "assert cfg.head.options == {'eta': -1.0}, cfg.head.options; "
        "assert 'tvr.models.heads.registry' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True)


def test_presets_are_addressed_by_name_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ folder here: the name resolves inside the installed package
    by_name = load_config("gare/msrvtt")
    assert by_name == load_config("gare/msrvtt.yaml") == load_config(PRESET_FILES["gare/msrvtt"])
    assert load_config("configs/gare/ablations/delta_only.yaml") == load_config("gare/ablations/delta_only")
    assert load_config("tvr/configs/proxy/msrvtt.yaml") == load_config("proxy/msrvtt")  # the layout before the move
    assert "gare/msrvtt" in config_mod.available_presets()
    assert config_mod.available_presets() == sorted(PRESET_FILES)
    for name, path in PRESET_FILES.items():
        assert config_mod.preset_path(name) == path.resolve()


def test_every_preset_describes_itself_in_one_line() -> None:
    """``tvr presets`` prints, beside each name, the preset's own description: what it is, which paper table or
    ablation, and the hardware it expects. A ``base:`` preset's description is never inherited."""
    from typer.testing import CliRunner

    from tvr.cli import app

    result = CliRunner().invoke(app, ["presets"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    for name, path in PRESET_FILES.items():
        own = (yaml.safe_load(path.read_text()) or {}).get("description")
        assert isinstance(own, str) and len(own) > 40 and "\n" not in own.strip(), f"{name}: no description of its own"
        assert config_mod.preset_description(name) == own.strip()
        assert re.search(r"\b(GPU|CPU)", own), f"{name}: the description names no hardware"
        paper = re.search(r"Table \d|main table|no paper number|not in the paper|spec §", own)
        assert paper, f"{name}: the description names no paper table or ablation"
        assert lines[name].endswith(own.strip()), f"tvr presets: {name} is listed without its description"


def test_a_description_is_the_files_own_and_not_a_setting(tmp_path: Path) -> None:
    parent = tmp_path / "parent.yaml"
    parent.write_text("description: the parent\ntrain:\n  lr: 0.5\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: parent.yaml\ntrain:\n  epochs: 2\n")
    assert load_config(child).train.lr == 0.5  # loads: the description is no config key
    assert config_mod.preset_description(child) == "" and config_mod.preset_description(parent) == "the parent"
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: |\n  two\n  lines\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: description: expected one line of text"):
        load_config(bad)


def test_a_user_file_wins_over_a_preset_of_the_same_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gare").mkdir()
    (tmp_path / "gare" / "msrvtt.yaml").write_text("train:\n  lr: 0.5\n")
    assert load_config("gare/msrvtt.yaml").train.lr == 0.5
    assert load_config("gare/msrvtt").head.name == "gare"  # no such file: the shipped preset


def test_unknown_preset_names_the_close_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"gare/msrvt: no such file.*tvr presets"):
        load_config("gare/msrvt")
    with pytest.raises(ConfigError, match=r"did you mean \['clip4clip/msrvtt', 'clipvip/msrvtt', 'gare/msrvtt'"):
        load_config("msrvtt")
    with pytest.raises(ConfigError, match="no such file"):
        load_config("../../etc/passwd")  # a name never leaves the preset folder


def test_the_cli_reads_an_old_run_config_in_a_fresh_process(tmp_path: Path) -> None:
    """The CLI loads the head registry (which registers the migration) before it parses a config, so a run folder's
    config.yaml written before head.options existed loads with nothing imported beforehand."""
    import subprocess
    import sys

    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump({"head": {"name": "gare", "gare": {"eta": -1.0}}}))
    code = f"from tvr.cli import _load; print(_load({str(old)!r}, []).head.options.eta)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "-1.0"


def _chain_comments(path: Path) -> str:
    """The comment lines of a preset and of every preset its ``base:`` chain names."""
    text = path.read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    base = (yaml.safe_load(text) or {}).get("base")
    if not base:
        return comments
    # a file beside it, else a shipped preset by name (a method's preset builds on a backbone's)
    return (
        comments + "\n" + _chain_comments(path.parent / base if (path.parent / base).is_file() else PRESET_FILES[base])
    )


def test_every_preset_notes_the_frame_rate_its_paper_used() -> None:
    """The frame rate of the video files is not a config value (it is how the files were prepared), so each preset
    says it: 3 fps for CLIP4Clip / GARE / TV-ProxyNet's MSR-VTT, 24 fps for TV-ProxyNet's DiDeMo, and so on."""
    import re

    from tvr.config import available_presets

    # run presets only: the bench configs (tvr/configs/bench/) render their own synthetic clips
    presets = [name for name in available_presets() if "/ablations/" not in name]
    assert len(presets) > 20
    for name in presets:
        assert re.search(r"\b\d+ fps\b", _chain_comments(PRESET_FILES[name])), f"{name}: no frame rate noted"
    assert "24 fps" in _chain_comments(PRESET_FILES["proxy/didemo"])
    assert "3 fps" in _chain_comments(PRESET_FILES["gravialign/msrvtt"])
    assert "3 fps" in _chain_comments(PRESET_FILES["gare/msvd"])
