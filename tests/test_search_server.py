"""``tvr serve``'s app: the JSON API returns what ``tvr search --json`` does, the page and the OpenAPI description are
served (no CDN-backed /docs page),
videos support range requests, and hostile requests (path traversal, huge or bad k / q / t, bad Range headers) get a
clear 4xx JSON answer while only the manifest's files are ever read; concurrent requests share one loaded model in
micro-batches whose answers are those of serial queries; ``tvr serve`` takes its port before the model loads."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from search_fixtures import index_args
from typer.testing import CliRunner

from tvr.cli import app as cli
from tvr.search import open_index
from tvr.search.batching import MicroBatcher
from tvr.search.server import API_MAX_K, API_MAX_QUERY, create_app


@pytest.fixture(scope="module")
def served(search_setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("served") / "idx"
    assert CliRunner().invoke(cli, index_args(search_setup.videos, out, search_setup.checkpoint)).exit_code == 0
    index = open_index(out)
    app = create_app(index)
    yield index, TestClient(app), out
    app.state.batcher.close()  # its workers stop (the client, used outside a with block, never shuts the app down)


def test_api_returns_the_cli_json(served) -> None:
    index, client, out = served
    response = client.get("/api/search", params={"q": "a magenta screen", "k": 3})
    assert response.status_code == 200
    api = response.json()
    cli_rows = json.loads(CliRunner().invoke(cli, ["search", str(out), "a magenta screen", "-k", "3", "--json"]).stdout)
    assert [{k: r[k] for k in ("video", "start", "end", "score", "rank")} for r in api] == cli_rows
    assert api[0]["video"] == "sub/magenta.mp4"
    number = api[0]["id"]
    assert index.videos[number]["video"] == "sub/magenta.mp4" and api[0]["media"] == f"/media/{number}"
    thumb = client.get(api[0]["thumbnail"])
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert thumb.content[:2] == b"\xff\xd8"  # a JPEG
    windows = client.get("/api/search", params={"q": "a yellow screen", "k": 8, "all_windows": "true"}).json()
    assert len(windows) == 8
    page = client.get("/")
    assert page.status_code == 200 and 'id="results"' in page.text and "/api/search" in page.text
    assert client.get("/docs").status_code == 404  # FastAPI's page loads its script from a CDN: off
    assert "/api/search" in client.get("/openapi.json").json()["paths"]


def test_media_is_served_with_ranges(served, search_setup) -> None:
    index, client, _ = served
    data = (search_setup.videos / index.videos[0]["video"]).read_bytes()
    full = client.get("/media/0")
    assert full.status_code == 200 and full.content == data and full.headers["accept-ranges"] == "bytes"
    part = client.get("/media/0", headers={"Range": "bytes=10-109"})
    assert part.status_code == 206 and part.content == data[10:110]
    assert part.headers["content-range"] == f"bytes 10-109/{len(data)}"
    tail = client.get("/media/0", headers={"Range": "bytes=-16"})
    assert tail.status_code == 206 and tail.content == data[-16:]


@pytest.mark.parametrize(
    "path",
    [
        "/media/-1",
        "/media/5",
        "/media/99999999999999",
        "/media/../../etc/passwd",
        "/media/..%2F..%2Fetc%2Fpasswd",
        "/media/%2e%2e",
        "/media/0x1",
        "/media/1.5",
        "/thumbnail/..%2Fsecret",
        "/thumbnail/7",
        "/media/red.mp4",
        "/media//etc/passwd",
        "/static/../pyproject.toml",
    ],
)
def test_no_request_reaches_another_file(served, path: str) -> None:
    _, client, _ = served
    response = client.get(path)
    assert 400 <= response.status_code < 500, (path, response.status_code)
    assert response.headers["content-type"].startswith("application/json")
    assert "error" in response.json()
    assert b"root:" not in response.content and b"[project]" not in response.content


@pytest.mark.parametrize(
    "params,status,needle",
    [
        ({"q": "x" * (API_MAX_QUERY + 1)}, 422, "q:"),
        ({"q": "x" * 60_000}, 422, "at most"),
        ({"q": ""}, 422, "q:"),
        ({"q": "   "}, 422, "empty"),
        ({}, 422, "q:"),
        ({"q": "red", "k": API_MAX_K + 1}, 422, "k:"),
        ({"q": "red", "k": 10**30}, 422, "k:"),
        ({"q": "red", "k": 0}, 422, "k:"),
        ({"q": "red", "k": "ten"}, 422, "k:"),
        ({"q": "red", "rerank": -1}, 422, "rerank:"),
        ({"q": "red", "all_windows": "perhaps"}, 422, "all_windows:"),
    ],
)
def test_bad_queries_get_clear_json_errors(served, params: dict, status: int, needle: str) -> None:
    _, client, _ = served
    response = client.get("/api/search", params=params)
    assert response.status_code == status
    assert needle in response.json()["error"]


@pytest.mark.parametrize(
    "header,status",
    [
        ("bytes=abc", 400),
        ("items=0-10", 400),
        ("bytes=20-10", 400),
        ("bytes=-", 400),
        ("bytes=" + "0-1," * 100, 400),
        ("bytes=" + ",".join(["0-1"] * 9), 400),
        ("bytes=99999999-", 416),
        ("bytes=-0", 416),
    ],
)
def test_bad_range_headers(served, header: str, status: int) -> None:
    _, client, _ = served
    response = client.get("/media/0", headers={"Range": header})
    assert response.status_code == status
    assert "error" in response.json()
    if status == 416:
        assert response.headers["content-range"].startswith("bytes */")


def test_bad_thumbnail_times(served) -> None:
    _, client, _ = served
    for t in ("nan", "inf", "-1", "1e30", "soon"):
        response = client.get("/thumbnail/0", params={"t": t})
        assert response.status_code == 422 and "t:" in response.json()["error"]
    assert client.get("/thumbnail/0", params={"t": 1e6}).status_code == 200  # past the end: the last frame


def test_concurrent_requests_share_one_model(served, monkeypatch) -> None:
    index, client, _ = served
    import tvr.models.checkpoint as checkpoint

    loads = []
    original = checkpoint.load_model
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: loads.append(a) or original(*a, **k))
    calls = []
    real = index.encoder.encode_texts

    def counting(texts, length=None):
        calls.append(len(texts))
        return real(texts, length)

    monkeypatch.setattr(index.encoder, "encode_texts", counting)
    queries = [c for c in ("a red screen", "a green screen", "a blue screen", "a yellow screen") for _ in range(4)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda q: client.get("/api/search", params={"q": q, "k": 2}).json(), queries))
    assert loads == [] and sum(calls) == len(queries)
    for q, answer in zip(queries, answers, strict=True):
        serial = [h.to_dict() for h in index.search(q, k=2)]
        assert [{k: hit[k] for k in ("video", "start", "end", "score", "rank")} for hit in answer] == serial
        assert answer[0]["video"].endswith(q.split()[1] + ".mp4")


@pytest.mark.parametrize("workers", [1, 3])
def test_micro_batches_answer_as_serial_queries(served, workers: int) -> None:
    from tvr.search.batching import MicroBatcher

    index, _, _ = served
    # a long tick: the 16 concurrent queries share a few passes
    batcher = MicroBatcher(index, tick=0.3, workers=workers)
    assert batcher.workers == workers
    texts = [c for c in ("a red screen", "a magenta screen", "yellow", "a blue screen") for _ in range(4)]
    settings = [{"k": 1 + n % 5, "all_windows": n % 3 == 0, "rerank": None if n % 2 else n} for n in range(16)]
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda a: batcher.search(a[0], **a[1]), zip(texts, settings, strict=True)))
        assert batcher.queries == 16 and batcher.batches < 16
        for text, options, answer in zip(texts, settings, answers, strict=True):
            assert answer == index.search(text, **options)
        with pytest.raises(ValueError, match="the query is empty"):
            batcher.search("   ")
        # what an async caller awaits: the query's error is its future's exception, a good answer its result
        assert "the query is empty" in str(batcher.submit("   ").exception(timeout=60))
        assert batcher.submit("yellow", 2).result(timeout=60) == index.search("yellow", 2)
    finally:
        batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.search("a red screen")


def test_workers_run_batches_at_once_and_one_at_a_time_means_one(served, monkeypatch) -> None:
    """Two micro-batch workers encode two batches at the same time (the second core's share), each query still
    getting its serial answer; ``micro_batch=False`` (the benchmark's baseline) answers one query at a time."""
    from tvr.search.batching import MicroBatcher, default_workers

    index, _, _ = served
    assert 1 <= default_workers() <= 8
    texts = ["a red screen", "a green screen", "a blue screen", "yellow"] * 4
    serial = {text: index.search(text, k=2) for text in set(texts)}
    running, most, lock = [0], [0], threading.Lock()

    def watched(real):
        def call(*args, **kwargs):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                time.sleep(0.2)  # long enough for the other worker's batch to start
                return real(*args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1

        return call

    monkeypatch.setattr(index, "answer", watched(index.answer))
    batcher = MicroBatcher(index, tick=0.05, max_batch=8, workers=2)
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda text: batcher.search(text, k=2), texts))
    finally:
        batcher.close()
    assert most[0] == 2 and batcher.queries == 16
    assert all(answer == serial[text] for text, answer in zip(texts, answers, strict=True))

    monkeypatch.undo()
    running[0] = most[0] = 0
    monkeypatch.setattr(index, "search", watched(index.search))
    with TestClient(create_app(index, micro_batch=False)) as alone, ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda text: alone.get("/api/search", params={"q": text, "k": 2}), texts[:8]))
    assert most[0] == 1 and all(reply.status_code == 200 for reply in replies)


def test_serve_command_takes_the_port_before_the_model_loads(served, monkeypatch) -> None:
    import socket

    import uvicorn

    import tvr.search

    _, _, out = served
    seen = {}
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, sockets: seen.update(app=self.config.app, at=sockets[0].getsockname())
    )
    result = CliRunner().invoke(cli, ["serve", str(out), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen["at"][0] == "127.0.0.1" and f"http://127.0.0.1:{seen['at'][1]}/" in result.output
    answer = TestClient(seen["app"]).get("/api/search", params={"q": "a red screen", "k": 1}).json()
    assert answer[0]["video"] == "red.mp4"
    result = CliRunner().invoke(cli, ["serve", str(out), "--port", "0", "--query-workers", "3"])
    assert result.exit_code == 0 and seen["app"].state.batcher.workers == 3
    for workers in ("0", "-1", "two"):
        bad = CliRunner().invoke(cli, ["serve", str(out), "--query-workers", workers])
        assert bad.exit_code == 2 and "--query-workers" in bad.output and "Traceback" not in bad.output
    missing = CliRunner().invoke(cli, ["serve", str(Path(out).parent / "nothing")])
    assert missing.exit_code == 2 and "not a tvr search index" in missing.output

    def no_model(*_a, **_k):
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(tvr.search, "open_index", no_model)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(out), "--port", str(port)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in result.output.splitlines()[0]
    result = CliRunner().invoke(cli, ["serve", str(out), "--port", "70000"])
    assert result.exit_code == 2 and "--port 70000: expected 0 to 65535" in result.output


def test_ctrl_c_on_serve_says_it_stopped_not_rerun_to_continue(search_index: Path, search_setup) -> None:
    """A real SIGINT to a running ``tvr serve``: uvicorn shuts down, and the last line says the server stopped
    (a server has nothing to continue), exit 130."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen(
        # its own cache holds no record of the index: the media folder is named
        [
            sys.executable,
            "-m",
            "tvr",
            "serve",
            str(search_index),
            "--port",
            "0",
            "--media-root",
            str(search_setup.videos),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        # the default Ctrl-C handling, whatever this test runner's own is
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "TVR_CACHE_DIR": str(search_index.parent / "cache")},
    )
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            address = re.search(r"on (http://127\.0\.0\.1:\d+/) ", line)
            if address:
                break
        assert address, "".join(seen)
        deadline = time.monotonic() + 60
        while True:  # up once its page answers
            try:
                with urllib.request.urlopen(address.group(1), timeout=2) as page:
                    assert page.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    last = rest.strip().splitlines()[-1]
    assert last.startswith("stopped: the server shut down on Ctrl-C") and "the same command serves it again" in last
    assert "continue" not in rest and "Traceback" not in rest


def test_the_page_names_its_icon_and_the_server_sends_it(served) -> None:
    """The favicon is the package's own SVG, sent by the server (no external fetch); /favicon.ico, where a browser
    looks by default, sends it too."""
    import xml.etree.ElementTree as ET

    _, client, _ = served
    page = client.get("/").text
    assert '<link rel="icon" href="/favicon.svg" type="image/svg+xml">' in page
    for address in ("/favicon.svg", "/favicon.ico"):
        icon = client.get(address)
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        root = ET.fromstring(icon.content)
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 32 32"
        assert b"http" not in icon.content.replace(b"http://www.w3.org/2000/svg", b"")  # nothing fetched from elsewhere
    assert "/favicon.svg" not in client.get("/openapi.json").json()["paths"]


class _EchoIndex:
    """What a micro-batcher needs of an index, answering at once (each query's text as its one "hit"): what is
    under test is the batcher's hand-over of queries and answers between threads, not the search."""

    def answer(self, queries: list) -> list:
        sum(n * n for n in range(2000))  # a little work holding the interpreter's lock, as a batch's Python part does
        return [[query.text] for query in queries]


def test_no_query_is_left_waiting_when_two_workers_race_for_it() -> None:
    """Two workers take queries from one queue, each gathering its batch for a 2 ms tick. Rounds of 16 queries
    handed in from 16 threads at once, with the interpreter switching threads every 10 µs (how a busy machine
    interleaves them), must each be answered within a second: with ``queue.SimpleQueue`` (CPython 3.11) a worker
    whose timed ``get`` lost its query to the other worker after its tick ran out waited for the *next* query instead
    of its tick, its gathered batch unanswered -- the rare hang of the concurrent-requests test above."""
    import sys

    from tvr.search.batching import MicroBatcher

    batcher = MicroBatcher(_EchoIndex(), tick=1e-4, workers=2)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        with ThreadPoolExecutor(16) as pool:
            for round_ in range(500):
                texts = [f"query {round_}.{n}" for n in range(16)]
                futures = list(pool.map(batcher.submit, texts))
                _, waiting = wait(futures, timeout=1.0)
                assert not waiting, f"round {round_}: {len(waiting)} of 16 queries unanswered after 1 s"
                assert [f.result() for f in futures] == [[text] for text in texts]
    finally:
        sys.setswitchinterval(switching)
        batcher.close()
    assert batcher.queries == 500 * 16


def test_a_search_not_answered_in_time_is_a_503_and_its_query_is_dropped(served, monkeypatch) -> None:
    """A request waits for its micro-batch at most ``query_timeout`` seconds, then gets a one-line 503; a query
    still queued when its request gave up is never run, and the worker goes on answering the next ones."""
    index, _, _ = served
    release = threading.Event()
    real = index.answer

    def stuck_once(queries):
        assert release.wait(60), "the test never released the worker"
        return real(queries)

    monkeypatch.setattr(index, "answer", stuck_once)
    app = create_app(index, query_timeout=0.3, query_workers=1)
    with TestClient(app) as client:
        for text in ("a red screen", "a green screen"):  # the first one stuck in the worker, the second queued
            response = client.get("/api/search", params={"q": text, "k": 1})
            assert response.status_code == 503
            assert response.json() == {
                "error": "the search was not answered within 0.3 s (server busy or stuck); try again"
            }
        release.set()
        response = client.get("/api/search", params={"q": "a blue screen", "k": 1})
        assert response.status_code == 200 and response.json()[0]["video"] == "blue.mp4"
        batcher = app.state.batcher
        assert (batcher.batches, batcher.queries) == (2, 2)  # the green screen's query was dropped, not run


def test_a_failed_batch_fails_its_requests_and_the_worker_goes_on(served, monkeypatch) -> None:
    """Whatever goes wrong in a batch (the index raising, or answering too few queries) is every one of its
    requests' JSON 500, never a request left waiting, and the same worker answers the next batch."""
    index, _, _ = served
    real = index.answer
    failures = iter([RuntimeError("boom"), "too few"])

    def failing_once_each(queries):
        failure = next(failures, None)
        if isinstance(failure, Exception):
            raise failure
        return real(queries)[:-1] if failure == "too few" else real(queries)

    monkeypatch.setattr(index, "answer", failing_once_each)
    app = create_app(index, query_timeout=30, query_workers=1)
    with TestClient(app, raise_server_exceptions=False) as client:
        for _ in range(2):
            response = client.get("/api/search", params={"q": "a red screen", "k": 1})
            assert response.status_code == 500
            assert response.json() == {"error": "internal error (RuntimeError); see the server's log"}
        answer = client.get("/api/search", params={"q": "a red screen", "k": 1}).json()
        assert answer[0]["video"] == "red.mp4"
    batcher = MicroBatcher(_EchoIndex(), workers=1)
    monkeypatch.setattr(batcher.index, "answer", lambda queries: [])
    try:
        error = batcher.submit("anything").exception(timeout=30)
        assert isinstance(error, RuntimeError) and "answered 0 of a batch's 1 queries" in str(error)
    finally:
        batcher.close()


def test_the_query_time_limit_is_set_by_tvr_query_timeout(served, monkeypatch) -> None:
    from tvr.search.server import DEFAULT_QUERY_TIMEOUT, query_timeout_seconds
    from tvr.utils.errors import UserError

    index, _, out = served
    monkeypatch.delenv("TVR_QUERY_TIMEOUT", raising=False)
    assert query_timeout_seconds() == DEFAULT_QUERY_TIMEOUT == 120
    monkeypatch.setenv("TVR_QUERY_TIMEOUT", "2.5")
    assert query_timeout_seconds() == 2.5
    for value in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("TVR_QUERY_TIMEOUT", value)
        with pytest.raises(UserError, match=f"TVR_QUERY_TIMEOUT='{value}': expected a number of seconds above 0"):
            create_app(index)
    with pytest.raises(ValueError, match="query_timeout"):
        create_app(index, query_timeout=0)
    result = CliRunner().invoke(cli, ["serve", str(out), "--port", "0"], env={"TVR_QUERY_TIMEOUT": "soon"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "TVR_QUERY_TIMEOUT='soon': expected a number of seconds above 0" in result.output
