"""What the command line says: user and exception text printed as written (brackets included), bad ``--set``
values blamed on the ``--set``, text fields taking a ``--set`` value literally, one wording for a file where a
folder belongs, Ctrl-C and a full disk saying what was kept, evaluation never touching a run's config."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
import yaml
from test_end_to_end import make_msrvtt
from typer.testing import CliRunner

import tvr.pipeline
from tvr.cli import app
from tvr.config import ConfigError, config_from_dict, load_config
from tvr.pipeline import resolve_config, run_train

runner = CliRunner()


def test_brackets_in_errors_print_as_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "-c", "gravialign/msrvtt", "-o", str(out), "--set", "head.options.logvar_init=20"]
    )
    assert result.exit_code == 2
    assert "must lie in [logvar_min, logvar_max] = [-10.0, 5.0]" in result.output
    assert "--set head.options.logvar_init=20" in result.output  # blamed on the --set, not the preset
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("data: [unclosed\n")
    result = runner.invoke(app, ["train", "-c", str(bad_yaml), "-o", str(out)])
    assert result.exit_code == 2 and "not valid YAML" in result.output and "[unclosed" in result.output


def test_checkpoint_key_lists_print_in_full(tmp_path: Path) -> None:
    """Missing / unexpected key lists are in brackets: they used to vanish as console markup."""
    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    ckpt = tmp_path / "other.pt"
    torch.save(
        {
            "format": "tvr-checkpoint",
            "version": 1,
            "model_class": "RetrievalModel",
            "model": {"head.stray.weight": torch.zeros(1)},
            "state": {},
            "rng": {},
        },
        ckpt,
    )
    result = runner.invoke(app, ["eval", "-c", str(config), "--checkpoint", str(ckpt), "-o", str(tmp_path / "ev")])
    assert result.exit_code == 2
    assert "unexpected keys [head.stray.weight]" in result.output
    assert "missing keys [" in result.output and "missing keys []" not in result.output


def test_import_checkpoint_key_lists_and_flag_names(tmp_path: Path) -> None:
    from test_import_checkpoint import _cfg, clip4clip_release

    from tvr.config import config_to_dict

    config = tmp_path / "gare.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(_cfg(head="gare"))))
    src = tmp_path / "pytorch_model.bin"
    torch.save(clip4clip_release(seed=1), src)
    result = runner.invoke(app, ["import-checkpoint", str(src), "-c", str(config), "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 2
    assert "missing [head.psi." in result.output and "pass --partial" in result.output
    empty = tmp_path / "empty.bin"
    torch.save({}, empty)
    result = runner.invoke(app, ["import-checkpoint", str(empty), "-c", str(config), "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 2 and "holds an empty dict" in result.output and "got dict" not in result.output
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff\xfe\x00binary junk, not a checkpoint")
    result = runner.invoke(app, ["import-checkpoint", str(junk), "-c", str(config), "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 2 and "neither a zip archive nor a pickle" in result.output
    assert "(101)" not in result.output and "arbitrary code" not in result.output
    result = runner.invoke(app, ["import-checkpoint", str(src), "-c", str(config), "-o", str(tmp_path)])
    assert result.exit_code == 2 and f"--out {tmp_path}: is a folder; expected a file" in result.output


def test_text_fields_take_set_values_literally() -> None:
    cfg = load_config(
        "clip4clip/msrvtt", ["data.video_pattern={video_id}.mp4", "data.annotations=[x]/y", "model.clip=[x]/y"]
    )
    assert cfg.data.video_pattern == "{video_id}.mp4"
    assert cfg.data.annotations == "[x]/y" and cfg.model.clip == "[x]/y"  # a backbone's setting: no valid YAML
    with pytest.raises(ConfigError, match=r"--set train\.lr=\{a\}: train\.lr: expected a number"):
        load_config("clip4clip/msrvtt", ["train.lr={a}"])  # not a text field: still YAML
    # a backbone's setting is typed when the run is resolved, so YAML's mapping reaches it (quote it for the text)
    with pytest.raises(ConfigError, match=r"^--set model\.clip=\{a: b\}: model\.clip: expected a string"):
        resolve_config_blamed(["model.clip={a: b}"])
    assert resolve_config(load_config("clip4clip/msrvtt", ['model.clip="{a: b}"'])).model.clip == "{a: b}"


def resolve_config_blamed(overrides: list[str]) -> None:
    from tvr.config import blame_overrides

    try:
        resolve_config(load_config("clip4clip/msrvtt", overrides))
    except ConfigError as exc:
        raise blame_overrides(exc, overrides) or exc from None


def test_bad_set_values_are_blamed_on_the_set(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("gare/msrvtt", ["data.max_frames=0"])
    assert str(info.value).startswith("--set data.max_frames=0: data.max_frames = 0")
    assert "msrvtt.yaml" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^--set train\.lrr=1: train: unknown key\(s\) \['lrr'\]"):
        load_config("gare/msrvtt", ["train.lrr=1"])
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  epochs: 0\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: train\.epochs = 0"):  # the file's own value: the file
        load_config(broken, ["train.lr=0.1"])


def test_a_file_where_a_folder_belongs_reads_the_same_everywhere(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    commands = {
        "--out": [
            ["train", "-c", str(config), "-o", str(a_file)],
            ["features", "-c", str(config), "-o", str(a_file)],
            ["synth", "-o", str(a_file)],
            ["demo", "-o", str(a_file)],
            ["eval", "-c", str(config), "--checkpoint", str(a_file), "-o", str(a_file)],
        ],
        "DST": [
            ["prepare", "videos", str(tmp_path / "data" / "videos"), str(a_file)],
            ["prepare", "frames", str(tmp_path / "data" / "videos"), str(a_file)],
        ],
        "OUT": [["tokenizer", str(a_file), str(a_file)]],
    }
    for flag, invocations in commands.items():
        for args in invocations:
            result = runner.invoke(app, args)
            assert result.exit_code == 2, (args, result.output)
            assert f"{flag} {a_file}: is a file; expected a folder (existing or new)" in result.output, args


def test_check_data_mentions_a_json_report_only_when_it_wrote_one(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    (tmp_path / "data" / "videos" / "video8.mp4").unlink()
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["check-data", "-c", str(config), "-j", "1"])
    assert result.exit_code == 1 and "NOT OK" in result.output
    assert "JSON report" not in result.output and "--json FILE" in result.output
    report = tmp_path / "report.json"
    result = runner.invoke(app, ["check-data", "-c", str(config), "-j", "1", "--json", str(report)])
    assert report.is_file() and f"JSON report {report}" in result.output


def test_prepare_frames_takes_set(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    cache = tmp_path / "frames"
    result = runner.invoke(
        app,
        [
            "prepare",
            "frames",
            str(tmp_path / "data" / "videos"),
            str(cache),
            "-c",
            str(config),
            "--set",
            "data.max_frames=3",
            "-j",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((cache / "frames_manifest.json").read_text())["settings"]["max_frames"] == 3


def test_eval_into_the_run_folder_keeps_the_runs_config(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["train"]["max_steps"] = 1
    run = tmp_path / "run"
    run_train(config_from_dict(values), run, final_test=False)
    recorded = (run / "config.yaml").read_text()
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(
        app,
        [
            "eval",
            "-c",
            str(config),
            "--checkpoint",
            str(run / "last.pt"),
            "-o",
            str(run),
            "--set",
            "eval.split=val",
            "--set",
            "eval.batch_size=2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (run / "config.yaml").read_text() == recorded
    evaluated = yaml.safe_load((run / "eval_config.yaml").read_text())
    assert evaluated["eval"]["split"] == "val" and evaluated["eval"]["batch_size"] == 2
    assert (run / "metrics.json").is_file()


def test_ctrl_c_says_what_was_kept(tmp_path: Path, monkeypatch) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["train"]["max_steps"] = 1
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tvr.pipeline, "run_train", interrupted)
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 130 and "holds no last.pt, so there is nothing to resume" in result.output
    monkeypatch.undo()
    run_train(config_from_dict(values), out, final_test=False)
    monkeypatch.setattr(tvr.pipeline, "run_train", interrupted)
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(out), "--resume"])
    assert result.exit_code == 130
    assert "last.pt (step 1, epoch 1 batch 1) is kept" in result.output and "--resume continues" in result.output

    import tvr.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "prepare_videos", interrupted)
    result = runner.invoke(app, ["prepare", "videos", str(tmp_path / "data" / "videos"), str(tmp_path / "dst")])
    assert result.exit_code == 130 and "everything finished so far is kept" in result.output


def test_a_full_disk_is_one_line_that_says_nothing_was_lost(tmp_path: Path, monkeypatch) -> None:
    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    import tvr.pipeline.features as features_job

    def no_space(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(features_job, "atomic_torch_save", no_space)
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(tmp_path / "cache")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no space left on the device writing" in result.output
    assert "nothing already written was lost" in result.output


def test_a_backbone_of_another_image_size_stops_at_preflight(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["data"]["image_size"] = 48  # the tiny backbone takes 32×32
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2
    assert "data.image_size = 48 but the backbone takes 32×32 images (model.tiny.image_size)" in result.output
    assert not out.exists()  # before the run folder is written
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(tmp_path / "cache")])
    assert result.exit_code == 2 and "data.image_size = 48" in result.output

    # a HF folder says its size in config.json
    from transformers import CLIPModel

    from tvr.models.backbones.clip.config import TinyClipConfig
    from tvr.models.backbones.clip.files import save_clip_atomic
    from tvr.models.backbones.clip.modeling import tiny_clip_config

    folder = save_clip_atomic(CLIPModel(tiny_clip_config(TinyClipConfig(**values["model"]["tiny"]))), tmp_path / "hf")
    values["model"]["clip"] = str(folder)
    values["model"]["tokenizer"] = str(tmp_path / "tok")
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(out)])
    assert (
        result.exit_code == 2 and f"model.clip = '{folder}' (its config.json vision_config.image_size)" in result.output
    )


def test_a_damaged_clip_folder_or_clipvip_checkpoint_is_one_line(tmp_path: Path) -> None:
    from transformers import CLIPModel

    from tvr.models.backbones.clip.config import TinyClipConfig
    from tvr.models.backbones.clip.files import save_clip_atomic
    from tvr.models.backbones.clip.modeling import tiny_clip_config

    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    folder = save_clip_atomic(CLIPModel(tiny_clip_config(TinyClipConfig(**values["model"]["tiny"]))), tmp_path / "hf")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    values["model"]["clip"] = str(folder)
    values["model"]["tokenizer"] = ""
    from tvr.data.tokenizer import build_tiny_tokenizer_files

    build_tiny_tokenizer_files(folder)
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(tmp_path / "cache")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not a loadable HF CLIP folder" in result.output
    (folder / "config.json").write_text("{ broken")
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(tmp_path / "cache2")])
    assert result.exit_code == 2 and "Traceback" not in result.output

    values["model"]["clip"] = "tiny"
    values["model"]["backbone"] = "clipvip"
    values["model"]["temporal"] = "none"
    junk = tmp_path / "clipvip.pt"
    junk.write_text("not a checkpoint")
    values["model"]["clipvip"] = {"checkpoint": str(junk)}
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(tmp_path / "cache3")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "model.clipvip.checkpoint" in result.output and "not a torch checkpoint" in result.output


def test_an_unreachable_hub_fails_at_once_without_retries(monkeypatch) -> None:
    import tvr.models.backbones.clip.modeling as clip_backbone
    import tvr.models.hub as hub

    calls: list[dict] = []

    def from_pretrained(spec, **kwargs):
        calls.append(kwargs)
        raise OSError(f"{spec} is not in the cache")

    probes: list[tuple] = []

    def no_network(address, timeout=None):
        probes.append(address)
        raise OSError(-2, "Name or service not known")

    monkeypatch.setattr(clip_backbone.CLIPModel, "from_pretrained", from_pretrained)
    monkeypatch.setattr(hub.socket, "create_connection", no_network)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        ConfigError,
        match=r"not in the local Hugging Face cache and the hub cannot be reached "
        r"\(huggingface\.co: Name or service not known\); offline\?",
    ):
        clip_backbone.load_clip_model("openai/clip-vit-base-patch32")
    assert [c.get("local_files_only") for c in calls] == [True]  # never an online attempt that retries
    calls.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="offline mode is on"):
        clip_backbone.load_clip_model("openai/clip-vit-base-patch32")
    assert [c.get("local_files_only") for c in calls] == [True] and len(probes) == 1


def _disk_full_after(marker: str, monkeypatch, calls: int = 1, after_bytes: int = 0) -> None:
    """Writes into the ``calls``-th temporary whose name holds ``marker`` (and every later one) fail past
    ``after_bytes`` bytes as on a full disk: ENOSPC naming no file, as ``write`` raises it."""
    import builtins

    import tvr.utils.io as io_module

    seen = {"n": 0}

    class FillsUp:
        def __init__(self, handle) -> None:
            self.handle, self.written = handle, 0

        def write(self, data) -> int:
            self.written += len(data)
            if self.written > after_bytes:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

    def full_disk_open(path, mode="r", *args, **kwargs):
        handle = builtins.open(path, mode, *args, **kwargs)
        if "w" in mode and marker in Path(path).name:
            seen["n"] += 1
            if seen["n"] >= calls:
                return FillsUp(handle)
        return handle

    monkeypatch.setattr(io_module, "open", full_disk_open, raising=False)


def test_a_disk_that_fills_up_inside_torch_save_is_one_line_naming_the_disk(tmp_path: Path, monkeypatch) -> None:
    """torch.save reports a failed write as a RuntimeError ("unexpected pos …"), with the OSError only as its
    context: a full disk during ``tvr train`` used to print a long traceback. The write here fails like a full
    disk, after the first 4 kB of a checkpoint."""
    values = make_msrvtt(tmp_path / "data")
    values["train"]["max_steps"] = 1
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    _disk_full_after(".last.pt.", monkeypatch, after_bytes=4096)
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(out), "--no-test"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "Traceback" not in result.output and "unexpected pos" not in text
    assert f"no space left on the device writing {out / 'last.pt'} (the file system mounted at /" in text
    assert "MiB free" in text and "nothing already written was lost" in text
    assert not (out / "last.pt").exists() and not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_the_help_names_search_and_serve_and_the_readme_lists_the_exit_codes() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    summary = " ".join(result.output.split()).split("Options")[0]
    assert all(word in summary for word in ("index", "search", "serve", "train", "evaluate"))
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    exit_codes = readme[readme.index("Exit codes:") :][:400]
    for code in ("**0**", "**1**", "**2**", "**130** interrupted by Ctrl-C"):
        assert code in exit_codes


def _one_disk_full_line(result, written: Path, command: str) -> str:
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    text = " ".join(result.output.split())
    assert len(errors) == 1 and f"no space left on the device writing {written} (the file system mounted at" in text
    assert "free" in text and f"free some space there and run {command} again" in text, text
    assert "nothing already written was lost" in text
    if command != "tvr train":
        assert "--resume" not in text
    return text


def test_every_command_names_the_file_and_the_file_system_a_full_disk_stopped(
    tmp_path: Path, search_setup, monkeypatch
) -> None:
    """13 of 17 disk-full messages named no file or file system and told every command to rerun tvr train with
    --resume: the shared writer now names the file (not its temporary), the message its file system and how the
    command that stopped continues."""
    values = make_msrvtt(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    cache = tmp_path / "cache"
    _disk_full_after("manifest.json", monkeypatch)
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache)])
    text = _one_disk_full_line(result, cache / "manifest.json", "tvr features")
    assert text.endswith("again: it continues the cache where it stopped (--debug or TVR_DEBUG=1 shows the traceback)")
    monkeypatch.undo()

    out = tmp_path / "eval"
    _disk_full_after("metrics.json", monkeypatch)
    result = runner.invoke(app, ["eval", "--checkpoint", str(search_setup.checkpoint), "-o", str(out)])
    _one_disk_full_line(result, out / "metrics.json", "tvr eval")
    monkeypatch.undo()

    from search_fixtures import index_args

    index = tmp_path / "idx"
    _disk_full_after("settings.json", monkeypatch)
    result = runner.invoke(app, index_args(search_setup.videos, index, search_setup.checkpoint))
    _one_disk_full_line(result, index / "settings.json", "tvr index")
    assert not [p for p in index.rglob("*") if p.name.endswith(".tmp")]


def test_a_full_disk_stops_a_batch_job_instead_of_failing_every_file(tmp_path: Path, monkeypatch) -> None:
    """prepare used to record every file after the disk filled up as failed (naming its temporary); the job now
    stops at once, keeps what it finished, and the same command continues."""
    import numpy as np

    import tvr.data.prepare as prepare_module
    from tvr.utils.io import atomic_output

    make_msrvtt(tmp_path / "data")
    videos, dst = tmp_path / "data" / "videos", tmp_path / "prepared"
    encode = prepare_module.encode_video
    encoded: list[str] = []

    def fills_up(src, out, settings):  # noqa: ANN001, ANN202
        if len(encoded) == 2:  # PyAV writing the temporary finds the disk full
            with atomic_output(out) as tmp:
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
        encoded.append(Path(out).name)
        return encode(src, out, settings)

    monkeypatch.setattr(prepare_module, "encode_video", fills_up)
    result = runner.invoke(app, ["prepare", "videos", str(videos), str(dst), "-j", "1"])
    _one_disk_full_line(result, dst / "video2.mp4", "tvr prepare videos")
    assert sorted(p.name for p in dst.iterdir() if p.suffix == ".mp4") == encoded == ["video0.mp4", "video1.mp4"]
    assert not (dst / "prepare_report.json").exists() and not [p for p in dst.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    result = runner.invoke(app, ["prepare", "videos", str(videos), str(dst), "-j", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads((dst / "prepare_report.json").read_text())
    assert report["summary"]["skipped"] == 2 and report["summary"]["encoded"] == 8

    frames, save = tmp_path / "frames", np.save
    written = {"n": 0}

    def short_write(file, array, **kwargs):  # noqa: ANN001, ANN202
        written["n"] += 1
        if written["n"] == 3:  # numpy on a full disk: an OSError with no errno
            raise OSError(f"{array.nbytes} requested and {array.nbytes // 2} written")
        return save(file, array, **kwargs)

    monkeypatch.setattr(prepare_module.np, "save", short_write)
    result = runner.invoke(app, ["prepare", "frames", str(videos), str(frames), "-j", "1", "--max-frames", "2"])
    text = _one_disk_full_line(result, frames / "video2.npy", "tvr prepare frames")
    assert "No space left on device (wrote" in text
