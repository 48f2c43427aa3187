"""An index folder from elsewhere is data: a damaged or tampered manifest, row table, ``ann.faiss``, shard file or
model stamp is refused in one line when the index is opened (never a traceback, a blocked read or a wrong answer),
``tvr serve`` serves only the indexed videos from the operator's media folder, and ``tvr index`` skips links that
leave the indexed folder."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from search_fixtures import index_args
from typer.testing import CliRunner

from tvr.cli import app
from tvr.search import open_index
from tvr.search.layout import ANN_FILE, MANIFEST, SETTINGS, TABLES
from tvr.search.server import create_app
from tvr.search.store import SHARDS, IndexFormatError

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(search_setup, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "idx"
    result = runner.invoke(app, index_args(search_setup.videos, out, search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def index(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "idx"
    shutil.copytree(pristine, copy)
    return copy


def _edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    value = change(value) or value
    path.write_text(json.dumps(value))


def _refused(index: Path, match: str) -> IndexFormatError:
    with pytest.raises(IndexFormatError, match=match) as info:
        open_index(index)
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------------------------- manifest


def _set(path: list, value) -> callable:
    def change(manifest):
        node = manifest
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda m: [m], "the file is a list, not an object"),
        (_set(["rows"], "7"), "'rows' is a string; expected a count"),
        (_set(["window"], -4), "'window' is a number; expected a positive number"),
        (_set(["shards"], ["../../elsewhere"]), "'shards' must name distinct shard folders"),
        (_set(["shards"], {"a": 1}), "'shards' is an object"),
        (_set(["videos", 0], 5), r"videos\[0\] is a number, not an object"),
        (_set(["videos", 0, "video"], "../../etc/passwd"), r"videos\[0\].video = '../../etc/passwd' is not a path"),
        (_set(["videos", 0, "video"], "/etc/passwd"), "is not a path inside the indexed folder"),
        (_set(["videos", 0, "size"], None), r"videos\[0\].size is null; expected an integer"),
        (_set(["videos", 1, "first_row"], 0), r"videos\[1\] \(.*\): its rows do not follow"),
        (_set(["rows"], 10**9), "the videos hold .* rows, the manifest says 1000000000"),
        (_set(["ann"], {"kind": "evil"}), "'ann' is an object; expected null or an object"),
        (_set(["ann", "storage"], "int4"), "'ann.storage' is 'int4', which this tvr cannot read"),
        (_set(["source"], "/"), "'source' is a string"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_refused_in_a_line(index: Path, change, match: str) -> None:
    _edit_json(index / MANIFEST, change)
    _refused(index, match)


def test_the_cli_says_it_in_a_line(index: Path) -> None:
    _edit_json(index / MANIFEST, _set(["videos", 0], 5))
    result = runner.invoke(app, ["search", str(index), "a red screen"])
    assert result.exit_code == 2 and "videos[0] is a number" in result.output and "Traceback" not in result.output


# --------------------------------------------------------------------------------------------- row tables


def _table(index: Path, number: int, change) -> None:
    path = index / TABLES[number]
    array = np.array(np.load(path))
    array = change(array)
    path.unlink()
    np.save(path, array, allow_pickle=False)


def _put(position, value):
    def change(array):
        array[position] = value
        return array

    return change


@pytest.mark.parametrize(
    "number,change,match",
    [
        (2, _put(0, -1), "a video number outside 0..4"),  # -1 used to return the last video
        (2, _put(-1, 5), "a video number outside 0..4"),
        (0, _put(0, 3), "a shard number outside 0..0"),
        (1, _put(0, 10**6), "a row outside its shard"),
        (1, _put(0, -2), "a row outside its shard"),
        (3, _put((0, 0), np.nan), "a window time that is not a finite number"),
        (2, lambda a: a.astype(np.float64), r"table_video.npy: float64 .*expected integer"),
        (0, lambda a: a[:-1], r"table_shard.npy: int32 \(\d+,\); expected integer \(\d+,\)"),
        (3, lambda a: a[:, :1], r"table_times.npy: float64 \(\d+, 1\); expected float"),
    ],
)
def test_row_tables_out_of_range_are_refused_on_open(index: Path, number: int, change, match: str) -> None:
    _table(index, number, change)
    _refused(index, match)


def test_a_pickled_table_is_refused(index: Path) -> None:
    path = index / TABLES[2]
    array = np.array(np.load(path)).astype(object)
    path.unlink()
    np.save(path, array, allow_pickle=True)
    _refused(index, r"table_video.npy: unreadable \(Array can.t be memory-mapped: Python objects")


# --------------------------------------------------------------------------------------------- ann.faiss


def _fifo_or_folder(path: Path, kind: str) -> None:
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "folder", "fifo", "lying", "missing"])
def test_a_damaged_ann_file_is_one_line(index: Path, damage: str) -> None:
    path = index / ANN_FILE
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage in ("folder", "fifo"):
        _fifo_or_folder(path, damage)
    elif damage == "missing":
        path.unlink()
    else:  # a valid FAISS file of another index: 3 vectors of 8 floats
        import faiss

        other = faiss.IndexFlatIP(8)
        other.add(np.eye(3, 8, dtype=np.float32))
        faiss.write_index(other, str(path))
    match = {
        "lying": r"ann.faiss: holds 3 vectors of 8 floats; the index has \d+ rows of \d+",
        "folder": "ann.faiss: a folder, not a regular file",
        "fifo": "ann.faiss: a FIFO, not a regular file",
        "missing": "ann.faiss: missing",
    }.get(damage, r"ann.faiss: unreadable \(")
    error = _opened_within(index, match)
    assert "index_read.cpp" not in str(error)  # FAISS's C++ position is not the user's business


def _opened_within(index: Path, match: str, seconds: float = 60.0) -> IndexFormatError:
    """``open_index`` must refuse, not block: run it in a thread, and free a blocked FIFO read if it hangs."""
    outcome: dict = {}

    def attempt() -> None:
        try:
            open_index(index)
            outcome["opened"] = True
        except Exception as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in (p for p in index.rglob("*") if p.is_fifo()):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let the blocked reader see an end of file
            os.close(fd)
        thread.join(10)
        pytest.fail("opening the index blocked on a FIFO")
    error = outcome.get("error")
    assert isinstance(error, IndexFormatError), outcome
    assert "\n" not in str(error)
    import re

    assert re.search(match, str(error)), str(error)
    return error


@pytest.mark.parametrize("name", ["emb.npy", "meta.json", TABLES[0], MANIFEST])
def test_a_fifo_in_place_of_an_index_file_is_refused_not_waited_on(index: Path, name: str) -> None:
    shard = next((index / SHARDS).iterdir())
    path = shard / name if name in ("emb.npy", "meta.json") else index / name
    path.unlink()
    os.mkfifo(path)
    if name == MANIFEST:  # an index without a manifest file is an unfinished one
        _opened_within(index, "the index is not finished")
    else:
        _opened_within(index, f"{path.name}: (unreadable (shard description )?\\()?a FIFO, not a regular file")


def test_embeddings_of_another_dtype_are_refused(index: Path) -> None:
    shard = next((index / SHARDS).iterdir())
    emb = np.load(shard / "emb.npy")
    np.save(shard / "emb.npy", emb.astype(np.float16), allow_pickle=False)
    _refused(index, r"emb.npy: float16 .* a shortlist embedding is float32")


# --------------------------------------------------------------------------------------------- model stamp


def test_an_index_cannot_make_tvr_import_a_module(index: Path, tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "planted_heads.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def plant(settings):
        settings["model"] = {"encoder": "config", "config": {"head": {"name": "planted_heads:Head"}}}

    _edit_json(index / SETTINGS, plant)
    _refused(index, r"model config does not load: .*head.name = 'planted_heads:Head' is an import path")
    result = runner.invoke(app, ["search", str(index), "a red screen"])
    assert result.exit_code == 2 and "--trust-code" in result.output
    assert not marker.exists() and "planted_heads" not in sys.modules


# --------------------------------------------------------------------------------------------- tvr serve


def _plant_video(index: Path, number: int, root: str, video: str, target: Path) -> None:
    st = target.stat()

    def plant(manifest):
        manifest["source"]["root"] = root
        entry = manifest["videos"][number]
        entry.update({"video": video, "size": st.st_size, "mtime_ns": st.st_mtime_ns})

    _edit_json(index / MANIFEST, plant)


def test_a_tampered_manifest_cannot_serve_another_file(index: Path, search_setup, tmp_path: Path) -> None:
    """The manifest names ``/`` and ``etc/passwd`` (with its true size and mtime): this user did not index ``/`` into
    it, so by default nothing is served (the app is refused at start); the operator's --media-root decides where
    videos come from, and even an operator who names ``/`` gets no text file served as a video."""
    from tvr.utils.errors import UserError

    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:secret\n" * 100)
    _plant_video(index, 0, "/", str(secret).lstrip("/"), secret)
    with pytest.raises(UserError, match="pass --media-root"):
        create_app(open_index(index))
    client = TestClient(create_app(open_index(index), media_root="/"))
    response = client.get("/media/0")
    assert response.status_code == 404 and "is not a video file" in response.json()["error"]
    assert b"root:" not in response.content
    assert client.get("/thumbnail/0").status_code == 404
    # the operator's media folder: only its own files, and only as indexed
    served = TestClient(create_app(open_index(index), media_root=search_setup.videos))
    assert served.get("/media/0").status_code == 404  # that name is not in the media folder
    other = open_index(index).videos[1]["video"]
    response = served.get("/media/1")
    assert response.status_code == 200 and response.content == (search_setup.videos / other).read_bytes()


def test_served_videos_must_be_what_was_indexed(index: Path, search_setup, tmp_path: Path) -> None:
    media = tmp_path / "media"
    shutil.copytree(search_setup.videos, media, copy_function=shutil.copy2)  # same sizes and mtimes
    opened = open_index(index)
    client = TestClient(create_app(opened, media_root=media))
    first, second = opened.videos[0]["video"], opened.videos[1]["video"]
    assert client.get("/media/0").status_code == 200
    outside = tmp_path / "outside.mp4"
    shutil.copy2(media / second, outside)
    (media / second).unlink()
    (media / second).symlink_to(outside)  # same bytes, same mtime, but outside the media folder
    response = client.get("/media/1")
    assert response.status_code == 404 and "not a file inside the media folder" in response.json()["error"]
    with open(media / first, "ab") as handle:  # changed since it was indexed
        handle.write(b"\0")
    response = client.get("/media/0")
    assert response.status_code == 404 and "changed since it was indexed" in response.json()["error"]


def test_an_error_while_answering_is_a_json_500(index: Path, search_setup, monkeypatch) -> None:
    opened = open_index(index)
    client = TestClient(
        create_app(opened, micro_batch=False, media_root=search_setup.videos), raise_server_exceptions=False
    )

    def damaged(*args, **kwargs):
        raise IndexFormatError("shards/x/state.npy changed since the index was opened: open the index again")

    monkeypatch.setattr(opened, "search", damaged)
    response = client.get("/api/search", params={"q": "red"})
    assert response.status_code == 500 and response.json() == {
        "error": "shards/x/state.npy changed since the index was opened: open the index again"
    }
    monkeypatch.setattr(opened, "search", lambda *a, **k: [][1])
    response = client.get("/api/search", params={"q": "red"})
    assert response.status_code == 500 and response.json()["error"].startswith("internal error (IndexError)")


def _swap_after_check(monkeypatch, swap) -> list:
    """Run ``swap()`` right after the server has checked a video (its container check is the check's last step),
    before the response is sent: the window a user who can write in the media folder races for."""
    from tvr.search import server

    real = server.is_video_container
    done: list = []

    def checked_then_swapped(*args, **kwargs):
        ok = real(*args, **kwargs)
        if not done:
            swap()
            done.append(True)
        return ok

    monkeypatch.setattr(server, "is_video_container", checked_then_swapped)
    return done


@pytest.fixture
def media(search_setup, tmp_path: Path) -> Path:
    """A copy of the indexed videos (same sizes and mtimes): the operator's media folder."""
    folder = tmp_path / "media"
    shutil.copytree(search_setup.videos, folder, copy_function=shutil.copy2)
    return folder


@pytest.mark.parametrize("what", ["file", "file-range", "folder"])
def test_a_video_swapped_after_its_check_is_not_what_is_sent(
    what: str, index: Path, media: Path, tmp_path: Path, monkeypatch
) -> None:
    """The indexed video (or the folder holding it) replaced by a link to a private file between the check and the
    send: what is sent is the file that was checked (it was opened once, and sent from that descriptor); the next
    request finds the link and refuses it."""
    opened = open_index(index)
    number = next(k for k, v in enumerate(opened.videos) if ("/" in v["video"]) == (what == "folder"))
    rel = Path(opened.videos[number]["video"])
    original = (media / rel).read_bytes()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / rel.name).write_bytes(b"root:x:0:0:secret\n" * 4000)

    def swap() -> None:
        if what == "folder":
            os.replace(media / rel.parent, tmp_path / "moved")
            (media / rel.parent).symlink_to(secret, target_is_directory=True)
        else:
            os.replace(media / rel, tmp_path / "moved.mp4")
            (media / rel).symlink_to(secret / rel.name)

    done = _swap_after_check(monkeypatch, swap)
    client = TestClient(create_app(opened, media_root=media))
    response = client.get(f"/media/{number}", headers={"Range": "bytes=10-109"} if what == "file-range" else {})
    assert done and b"root:" not in response.content
    if what == "file-range":
        assert response.status_code == 206 and response.content == original[10:110]
    else:
        assert response.status_code == 200 and response.content == original
    assert client.get(f"/media/{number}").status_code == 404


def test_a_thumbnail_is_decoded_from_the_video_that_was_checked(
    index: Path, media: Path, search_setup, tmp_path: Path, monkeypatch
) -> None:
    import av

    from tvr.search.server import thumbnail_jpeg

    opened = open_index(index)
    rel = opened.videos[0]["video"]
    want = thumbnail_jpeg(media / rel, 0.0)
    client = TestClient(create_app(opened, media_root=media))
    assert client.get("/media/0").status_code == 200  # checked (and its check remembered)
    private = tmp_path / "private.mp4"
    shutil.copy2(search_setup.videos / "red.mp4", private)
    real_open = av.open
    swapped: list = []

    def swap_then_open(target, *args, **kwargs):
        if not swapped:
            os.replace(media / rel, tmp_path / "moved.mp4")
            (media / rel).symlink_to(private)
            swapped.append(True)
        return real_open(target, *args, **kwargs)

    monkeypatch.setattr(av, "open", swap_then_open)
    response = client.get("/thumbnail/0", params={"t": 0})
    assert swapped and response.status_code == 200 and response.content == want


def test_links_that_stay_inside_the_media_folder_are_served(search_setup, tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos, copy_function=shutil.copy2)
    (videos / "inside.mp4").symlink_to(videos / "green.mp4")  # absolute, inside
    (videos / "sub" / "again.mp4").symlink_to("../red.mp4")  # relative, inside
    (videos / "linked").symlink_to(videos / "sub", target_is_directory=True)  # a folder, inside
    result = runner.invoke(app, index_args(videos, tmp_path / "idx", search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    opened = open_index(tmp_path / "idx")
    client = TestClient(create_app(opened))
    for number, entry in enumerate(opened.videos):
        response = client.get(f"/media/{number}")
        assert response.status_code == 200 and response.content == (videos / entry["video"]).read_bytes(), entry


@pytest.fixture
def own_index(search_setup, tmp_path: Path) -> Path:
    """An index this user built (``tvr index``) of a copy of the videos, in place."""
    videos = tmp_path / "videos"
    shutil.copytree(search_setup.videos, videos, copy_function=shutil.copy2)
    result = runner.invoke(app, index_args(videos, tmp_path / "idx", search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    return tmp_path / "idx"


@pytest.mark.parametrize("widened", ["/", "the folder above"])
def test_a_manifest_cannot_widen_the_served_folder(
    widened: str, own_index: Path, search_setup, tmp_path: Path, monkeypatch
) -> None:
    """An index's manifest edited to say its videos are in ``/`` (or the folder above the indexed one) and to list a
    private video outside the indexed folder, with its true size and mtime: by default nothing outside the folder
    the user indexed is served; ``--media-root`` names the folder to serve, and only its indexed files are."""
    import uvicorn

    from tvr.utils.errors import UserError

    private = tmp_path / "private" / "holiday.mp4"
    private.parent.mkdir()
    shutil.copy2(search_setup.videos / "red.mp4", private)
    root = Path("/") if widened == "/" else tmp_path
    _plant_video(own_index, 0, str(root), str(private.relative_to(root)), private)
    try:
        client = TestClient(create_app(open_index(own_index)))
    except UserError as exc:
        assert "--media-root" in str(exc) and "\n" not in str(exc)
    else:
        response = client.get("/media/0")
        assert response.status_code == 404 and response.content != private.read_bytes()
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    result = runner.invoke(app, ["serve", str(own_index), "--port", "0"])
    assert result.exit_code == 2 and "--media-root" in result.output, result.output
    served = TestClient(create_app(open_index(own_index), media_root=tmp_path / "videos"))
    assert served.get("/media/0").status_code == 404  # private/holiday.mp4 is not in the media folder
    assert served.get("/media/1").status_code == 200


def test_a_media_folder_that_is_gone_still_answers_searches(index: Path, tmp_path: Path) -> None:
    client = TestClient(create_app(open_index(index), media_root=tmp_path / "gone", micro_batch=False))
    assert client.get("/api/search", params={"q": "a red screen"}).status_code == 200
    response = client.get("/media/0")
    assert response.status_code == 404 and "no longer available" in response.json()["error"]


def test_an_index_serves_the_folder_it_was_built_from_by_default(own_index: Path, tmp_path: Path) -> None:
    """By default videos come from the folder this user indexed into this index; a copy of the index (made
    elsewhere, or moved) names its folder with --media-root."""
    client = TestClient(create_app(open_index(own_index)))
    assert (
        client.get("/media/0").content == (tmp_path / "videos" / open_index(own_index).videos[0]["video"]).read_bytes()
    )
    copy = tmp_path / "copy"
    shutil.copytree(own_index, copy)
    from tvr.utils.errors import UserError

    with pytest.raises(UserError, match="--media-root"):
        create_app(open_index(copy))
    assert TestClient(create_app(open_index(copy), media_root=tmp_path / "videos")).get("/media/0").status_code == 200


# --------------------------------------------------------------------------------------------- tvr index


def test_links_that_leave_the_folder_are_skipped_and_reported(search_setup, tmp_path: Path) -> None:
    videos, elsewhere = tmp_path / "videos", tmp_path / "elsewhere"
    shutil.copytree(search_setup.videos, videos)
    elsewhere.mkdir()
    shutil.copy(search_setup.videos / "red.mp4", elsewhere / "far.mp4")
    (videos / "secret.mp4").symlink_to("/etc/passwd")
    (videos / "linked").symlink_to(elsewhere, target_is_directory=True)
    (videos / "inside.mp4").symlink_to(videos / "green.mp4")  # a link that stays inside is indexed
    result = runner.invoke(app, index_args(videos, tmp_path / "idx", search_setup.checkpoint))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "idx" / "report.json").read_text())
    bad = {b["video"]: b["error"] for b in report["bad"]}
    assert set(bad) == {"secret.mp4", "linked/far.mp4"}
    assert all("outside the indexed folder" in error for error in bad.values())
    indexed = {v["video"] for v in json.loads((tmp_path / "idx" / MANIFEST).read_text())["videos"]}
    assert "inside.mp4" in indexed and not indexed & set(bad)
    assert "secret.mp4" in result.output and "skipped" in result.output
