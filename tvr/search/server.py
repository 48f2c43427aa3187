"""``tvr serve``: a FastAPI app over one loaded index — a search page, a JSON API, thumbnails and the videos.

Safe by construction:

* the only files ever read for a request are the videos the manifest lists, addressed by their number in it
  (``/media/3``); no part of a request is ever turned into a path;
* the index does not choose what is served: a video is looked up in the media folder the operator names
  (``--media-root``), by default the folder this user indexed into this index (:mod:`tvr.search.indexed_folders`:
  a manifest edited to name ``/`` or any other folder is refused at start), and served only when it is a regular
  file inside that folder (symbolic links followed only while they stay inside), of the size and modification time
  the manifest recorded when it was indexed, and a container FFmpeg opens with a video stream;
* what is checked is what is sent: a video is opened once, walking its path from the media folder's descriptor
  without ever opening a name through a link (:func:`tvr.utils.open_inside.open_inside`), checked on that
  descriptor, and sent (ranges included) or decoded for a thumbnail from it — replacing the file or a folder on its
  way with a link after the check changes nothing that request sends;
* an error while answering (a damaged index file read mid-query) is a JSON 500, never a plain-text one;
* every input is bounded (query length, k, rerank, thumbnail time) and a bad one gets a 4xx JSON answer
  ``{"error": "...", ...}``, never a traceback;
* videos are sent with HTTP range support (seeking in the player), and a range that cannot be satisfied is a 416;
* one model, loaded once, serves every request; concurrent queries are micro-batched (:mod:`tvr.search.batching`:
  one text-encoder pass per short tick for all the queries that arrived, then each query's own shortlist and exact
  rerank; one such worker per core), so many users share the model without queueing behind each other's passes.

There is no ``/docs`` page: FastAPI's loads its script and styles from a CDN, so it is blank offline; the API's
OpenAPI description is ``/openapi.json``.

Nothing here authenticates: bind to 127.0.0.1 (the default) or put the app behind a proxy that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import math
import os
import re
import stat
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

import anyio
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from tvr.data.prepare import VIDEO_EXTENSIONS
from tvr.search.batching import MicroBatcher
from tvr.search.filters import FilterError, WindowFilter, window_filter
from tvr.search.index import MAX_QUERY_CHARS, Hit, SearchIndex
from tvr.search.indexed_folders import default_media_root
from tvr.utils.errors import UserError
from tvr.utils.json_values import plain_json
from tvr.utils.open_inside import OutsideFolderError, open_folder, open_inside

log = logging.getLogger(__name__)

#: bounds of the web API (tighter than the library's)
API_MAX_K = 100
API_MAX_RERANK = 1000
API_MAX_QUERY = 500
API_MAX_PATH = 1000
THUMB_WIDTH = 240
THUMB_CACHE = 512
#: seconds a search request waits for its micro-batch's answer before it is answered 503 (``TVR_QUERY_TIMEOUT``
#: overrides it): far longer than any batch takes, so only a stuck or hopelessly overloaded server reaches it
DEFAULT_QUERY_TIMEOUT = 120.0


def query_timeout_seconds() -> float:
    """``TVR_QUERY_TIMEOUT`` (seconds, above 0), else :data:`DEFAULT_QUERY_TIMEOUT`."""
    value = os.environ.get("TVR_QUERY_TIMEOUT", "")
    try:
        seconds = float(value) if value else DEFAULT_QUERY_TIMEOUT
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise UserError(f"TVR_QUERY_TIMEOUT={value!r}: expected a number of seconds above 0")
    return seconds


def thumbnail_jpeg(video: Path | BinaryIO, seconds: float, width: int = THUMB_WIDTH) -> bytes:
    """One JPEG of the frame shown at ``seconds`` in ``video`` (a path, or an open file; the last frame when the time
    is past the end), ``width`` pixels wide, encoded with FFmpeg's MJPEG encoder through PyAV."""
    import av

    with av.open(video if not isinstance(video, Path) else str(video)) as container:
        stream = container.streams.video[0]
        if seconds > 0 and stream.time_base is not None:
            container.seek(int(seconds / stream.time_base), stream=stream, backward=True, any_frame=False)
        chosen = None
        for frame in container.decode(stream):
            chosen = frame
            if frame.time is None or frame.time >= seconds:
                break
        if chosen is None:
            raise ValueError("no frame decodes")
    height = max(2, int(round(chosen.height * width / max(1, chosen.width) / 2)) * 2)
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height = width, height
    codec.pix_fmt = "yuvj420p"
    codec.time_base = Fraction(1, 25)
    image = chosen.reformat(width=width, height=height, format="yuvj420p")
    out = io.BytesIO()
    for packet in [*codec.encode(image), *codec.encode(None)]:
        out.write(bytes(packet))
    return out.getvalue()


def page_html() -> str:
    return resources.files("tvr.search").joinpath("static/page.html").read_text(encoding="utf-8")


def favicon_svg() -> bytes:
    return resources.files("tvr.search").joinpath("static/favicon.svg").read_bytes()


class HitOut(BaseModel):
    """One result: the fields of ``tvr search --json`` plus where the page finds the video and its thumbnail."""

    video: str
    start: float
    end: float
    score: float
    rank: int
    id: int
    media: str
    thumbnail: str


#: FFmpeg demuxers of the video containers ``tvr index`` reads (FFmpeg also "opens" a text file as a video, through
#: its tty demuxer, and an image through image2: those are not videos)
VIDEO_DEMUXERS = frozenset(
    {"mov", "mp4", "m4a", "3gp", "3g2", "mj2", "matroska", "webm", "avi", "mpeg", "mpegvideo", "flv", "asf", "mpegts"}
)


def is_video_container(video: Path | BinaryIO, name: str | None = None) -> bool:
    """Whether ``video`` (a path, or an open file named ``name``) has a video file's suffix and FFmpeg opens it as one
    of :data:`VIDEO_DEMUXERS` with a video stream."""
    import av

    if Path(name if name is not None else str(video)).suffix.lower() not in VIDEO_EXTENSIONS:
        return False
    try:
        with av.open(video if not isinstance(video, Path) else str(video)) as container:
            return bool(set(container.format.name.split(",")) & VIDEO_DEMUXERS) and bool(container.streams.video)
    except Exception:  # noqa: BLE001 - any file FFmpeg cannot open is simply not a video
        return False


def create_app(
    index: SearchIndex,
    *,
    micro_batch: bool = True,
    media_root: str | os.PathLike | None = None,
    query_workers: int | None = None,
    query_timeout: float | None = None,
) -> FastAPI:
    """The FastAPI app serving ``index`` (see the module docstring); videos are looked up in ``media_root``
    (default: the folder this user indexed into the index, else a :class:`~tvr.utils.errors.UserError` asking for
    it). Queries are micro-batched by ``query_workers`` workers (default: one per core,
    :func:`~tvr.search.batching.default_workers`); a search not answered within ``query_timeout`` seconds (default:
    :func:`query_timeout_seconds`) is answered 503. ``micro_batch=False``: one query at a time, each waiting for the
    one before (what ``benchmarks/search_serve.py`` compares against)."""
    query_timeout = query_timeout_seconds() if query_timeout is None else float(query_timeout)
    if not 0 < query_timeout < math.inf:
        raise ValueError(f"query_timeout must be a number of seconds above 0, got {query_timeout}")
    numbers = {entry["video"]: k for k, entry in enumerate(index.videos)}
    root = Path(media_root) if media_root is not None else default_media_root(index.path, index.root)
    media_files = _MediaFiles(index, root)
    batcher = MicroBatcher(index, workers=query_workers) if micro_batch else None
    one_at_a_time = threading.Lock()

    def search_alone(text: str, k: int, rerank: int | None, all_windows: bool, where: WindowFilter | None) -> list[Hit]:
        under, between = (where.under, where.between) if where is not None else (None, None)
        with one_at_a_time:
            return index.search(text, k, rerank=rerank, all_windows=all_windows, under=under, between=between)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        if batcher is not None:
            batcher.close()

    app = FastAPI(
        title="tvr search",
        version="1",
        description=f"Text search over the {len(index)} videos of {index.location} (tvr index).",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )

    _answer_errors_as_json(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(page_html())

    # the page links /favicon.svg; /favicon.ico is where a browser looks when a page names no icon
    @app.get("/favicon.svg", include_in_schema=False)
    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(favicon_svg(), media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/api/search", response_model=list[HitOut], summary="Search the videos by text")
    async def search(
        q: str = Query(..., min_length=1, max_length=API_MAX_QUERY, description="The text to search for."),
        k: int = Query(10, ge=1, le=API_MAX_K, description="Results to return."),
        all_windows: bool = Query(False, description="Return windows instead of one best window per video."),
        rerank: int | None = Query(None, ge=0, le=API_MAX_RERANK, description="Windows scored exactly."),
        under: str | None = Query(
            None,
            max_length=API_MAX_PATH,
            description="Only the videos under this folder (or this video), as the index lists them: holiday/2024.",
        ),
        between: str | None = Query(
            None, max_length=64, description="Only the windows sharing time with START,END seconds: 60,120."
        ),
    ) -> JSONResponse:
        if not q.strip():
            raise HTTPException(422, "q: the query is empty")
        text = q[:MAX_QUERY_CHARS]
        try:
            where = window_filter(under or None, between or None)
        except FilterError as exc:
            raise HTTPException(422, str(exc).removeprefix("--")) from None
        if batcher is not None:
            # the request waits for its batch without holding a worker thread (a batcher's thread does the work)
            answer = asyncio.wrap_future(batcher.submit(text, k, rerank=rerank, all_windows=all_windows, where=where))
            try:
                # asyncio.wait, not wait_for: a TimeoutError the search itself raised stays that error, not this 503
                answered, _ = await asyncio.wait({answer}, timeout=query_timeout)
            finally:
                answer.cancel()  # nothing once answered; else the query is dropped from the batcher's queue
            if not answered:
                log.warning("a search was not answered within %g s: answered 503", query_timeout)
                raise HTTPException(
                    503, f"the search was not answered within {query_timeout:g} s (server busy or stuck); try again"
                )
            hits = answer.result()
        else:
            hits = await run_in_threadpool(search_alone, text, k, rerank, all_windows, where)
        # the rows are built from typed hits, so they are sent as they are: response_model (HitOut) describes them
        # in the OpenAPI document without validating each answer again (a measurable share of a request's CPU)
        return JSONResponse([_hit_row(hit, numbers[hit.video]) for hit in hits])

    @app.get("/media/{number}", summary="A video of the index (HTTP range requests supported)")
    def media(request: Request, number: int = PathParam(..., ge=0, le=10**9)) -> FileResponse:
        video = media_files.open(number)
        try:
            header = request.headers.get("range")
            if header is not None:
                check_range(header, video.stat.st_size)
        except BaseException:
            video.close()
            raise
        return _OpenFileResponse(
            video, media_type=_media_type(video.name), filename=video.name, content_disposition_type="inline"
        )

    @functools.lru_cache(maxsize=THUMB_CACHE)
    def cached_thumbnail(number: int, seconds: float, version: tuple[int, ...]) -> bytes:
        with media_files.open(number) as video:
            if video.version != version:
                raise HTTPException(404, f"video number {number} changed while its thumbnail was made")
            return thumbnail_jpeg(video.handle, seconds)

    @app.get("/thumbnail/{number}", summary="A JPEG of the frame at time t (seconds) of a video of the index")
    def thumbnail(
        number: int = PathParam(..., ge=0, le=10**9), t: float = Query(0.0, ge=0.0, le=1e7, allow_inf_nan=False)
    ) -> Response:
        with media_files.open(number) as video:
            version = video.version
        try:
            data = cached_thumbnail(number, round(t, 1), version)
        except HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - an undecodable file is the client's 404, not a server error
            raise HTTPException(404, f"video number {number}: no thumbnail ({type(exc).__name__})") from None
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})

    app.state.index = index
    app.state.batcher = batcher
    app.state.media_root = media_files.root
    return app


def _hit_row(hit: Hit, number: int) -> dict[str, Any]:
    """One row of a search answer (:class:`HitOut`): the hit, with the links to its video and its thumbnail (the
    middle of its window)."""
    middle = round((hit.start + hit.end) / 2, 3)
    # vars(hit) is hit.to_dict() (flat fields, in order) without dataclasses.asdict's recursive deep copy, which
    # cost ~0.7 ms of the event loop's time per 10-hit answer (cProfile of a benchmark round)
    return {**vars(hit), "id": number, "media": f"/media/{number}", "thumbnail": f"/thumbnail/{number}?t={middle}"}


def _answer_errors_as_json(app: FastAPI) -> None:
    """Every failed request gets ``{"error": one line}``: a request that does not validate (422, with the details),
    an HTTP error, a damaged index file met while answering, and anything else (logged, named by type only)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()
        ]
        return JSONResponse({"error": "; ".join(problems), "detail": jsonable(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def failed(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, UserError):  # a damaged index file met while answering: its one-line message
            return JSONResponse({"error": str(exc)}, status_code=500)
        log.exception("request failed")
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); see the server's log"}, status_code=500)


@dataclass
class _Video:
    """An indexed video opened and checked (:meth:`_MediaFiles.open`): sent or decoded from ``handle`` only."""

    handle: BinaryIO
    stat: os.stat_result
    name: str
    #: (device, inode, size, mtime): which version of the file this is
    version: tuple[int, ...]

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> _Video:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MediaFiles:
    """The indexed videos as files the server may send: inside the media folder ``root``, unchanged since they
    were indexed, and (checked once per version of a file) a video container FFmpeg opens. The folder is opened
    once, when the app is made; every video is opened from that descriptor (module docstring)."""

    def __init__(self, index: SearchIndex, root: Path) -> None:
        self.index = index
        try:
            self.folder_fd: int | None
            self.folder_fd, self.root = open_folder(root)
            weakref.finalize(self, os.close, self.folder_fd)
        except OSError as exc:  # searches still answer; every video is a 404 saying it is not available
            log.warning("the media folder %s cannot be opened (%s): no video will be served", root, exc.strerror)
            self.folder_fd, self.root = None, Path(root)
        self.verified: set[tuple[int, ...]] = set()  # (number, device, inode, size, mtime)

    def open(self, number: int) -> _Video:
        """Video ``number`` opened and checked, or an HTTP 404 saying why it cannot be sent."""
        index = self.index
        if not 0 <= number < len(index):
            raise HTTPException(404, f"no video number {number} in this index (0 to {len(index) - 1})")
        entry = index.videos[number]
        try:
            if self.folder_fd is None:
                raise FileNotFoundError(self.root)
            fd = open_inside(self.folder_fd, self.root, entry["video"])
        except OutsideFolderError:
            raise HTTPException(404, f"video number {number} is not a file inside the media folder") from None
        except OSError:
            raise HTTPException(404, f"video number {number} is no longer available") from None
        handle = os.fdopen(fd, "rb")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise HTTPException(404, f"video number {number} is not a file inside the media folder")
            if (st.st_size, st.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
                raise HTTPException(404, f"video number {number} changed since it was indexed (run tvr index again)")
            name = Path(entry["video"]).name
            version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if (number, *version) not in self.verified:
                if not is_video_container(handle, name):
                    raise HTTPException(404, f"video number {number} is not a video file")
                self.verified.add((number, *version))
            handle.seek(0)
        except BaseException:
            handle.close()
            raise
        return _Video(handle, st, name, version)


#: what an :class:`_OpenFileResponse` gives Starlette as its path: no such file exists, so a Starlette that opened
#: the file by name instead of through :meth:`_OpenFileResponse._open_file` would fail, never send another file
_NO_PATH = "/nonexistent/tvr-serve-sends-from-an-open-descriptor"


class _OpenFileResponse(FileResponse):
    """Starlette's FileResponse (HTTP ranges, HEAD, If-Range, ETag, Last-Modified) sent from a video opened and
    checked beforehand (:class:`_Video`), never reopened by name; the file is closed when the response ends."""

    def __init__(self, video: _Video, **kwargs: Any) -> None:
        super().__init__(_NO_PATH, stat_result=video.stat, **kwargs)
        self.video = video

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # the ASGI "pathsend" extension would have the server open the path by name: not offered
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
        try:
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self.video.close()

    @contextlib.asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        yield anyio.wrap_file(self.video.handle)


#: ranges accepted in one Range header (players ask for one)
MAX_RANGES = 8
_RANGE = re.compile(r"^bytes=\s*(\d*-\d*\s*(,\s*\d*-\d*\s*)*)$")


def check_range(header: str, size: int) -> None:
    """Refuse a Range header that is malformed (400) or that no byte of the file satisfies (416), with a JSON
    answer; a valid one is served by Starlette's FileResponse."""
    if len(header) > 256:
        raise HTTPException(400, "Range header: longer than 256 characters")
    match = _RANGE.match(header.strip())
    if match is None:
        raise HTTPException(400, f"Range header {header[:64]!r}: expected bytes=START-END[, ...]")
    parts = [p.strip() for p in match.group(1).split(",")]
    if len(parts) > MAX_RANGES:
        raise HTTPException(400, f"Range header: {len(parts)} ranges, at most {MAX_RANGES}")
    satisfiable = False
    for part in parts:
        first, _, last = part.partition("-")
        if not first and not last:
            raise HTTPException(400, f"Range header: empty range {part!r}")
        if first and last and int(first) > int(last):
            raise HTTPException(400, f"Range header: range {part!r} ends before it starts")
        if (first and int(first) < size) or (not first and int(last) > 0):
            satisfiable = True
    if not satisfiable:
        raise HTTPException(
            416,
            f"Range header {header[:64]!r}: no byte of the {size}-byte file is in range",
            headers={"Content-Range": f"bytes */{size}"},
        )


def _media_type(name: str) -> str:
    return {
        ".mp4": "video/mp4",
        ".m4v": "video/mp4",
        ".webm": "video/webm",
        ".mkv": "video/x-matroska",
        ".mov": "video/quicktime",
        ".avi": "video/x-msvideo",
        ".ogv": "video/ogg",
    }.get(Path(name).suffix.lower(), "application/octet-stream")


def jsonable(value: Any) -> Any:
    """Validation errors as plain JSON (their ``ctx`` may hold exception objects, which are stated as text)."""
    return plain_json(value, _plain_or_text)


def _plain_or_text(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
