"""``museum-search serve``: the JSON API and the visitor page over the one query pipeline.

A view over core, like the CLI and the GUI: every answer comes from :class:`QueryPipeline`
(``Answer.to_dict``, as ``query --json`` prints it), with server paths replaced by opaque ids.
Decoding and querying run on a bounded pool of worker threads (:mod:`.workers`), never on the
event loop; the photo is read with size and time limits (:mod:`.upload`). The handlers are
module-level functions on :data:`router` that read what they need from ``request.app.state``
(set by :func:`create_app`), so each can be tested alone. Nothing here writes the
index; what is written goes to the index's visitor log (core.visitors: anonymous counts, and kept
photos only when staff asked for them), beside the index, never inside it or the collection."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
import cv2
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from museum_search import __version__
from museum_search.core.answer import (
    QueryImage,
    QueryPipeline,
    QuerySettings,
    RegionError,
    confidence_band,
    outline_in_photo,
    parse_region,
    query_from_bytes,
)
from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.images import decode_image
from museum_search.core.index import Index
from museum_search.core.visitors import KeepPolicy, VisitorLog
from museum_search.serve.server import HEADER_LIMIT
from museum_search.serve.upload import ApiError, Shares, Upload, read_photo
from museum_search.serve.workers import Busy, WorkerPool

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
CSP = ("default-src 'self'; img-src 'self' blob: data:; style-src 'self' 'unsafe-inline'; "
       "script-src 'self' 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
IMAGE_SIZES = (32, 2048)
BUSY = "busy, try again"
_LANG = re.compile(r"^[A-Za-z]{1,8}(?:[-_][A-Za-z0-9]{1,8}){0,4}$")
_ID = re.compile(r"^([0-9a-f]{1,12})-([0-9a-f]{10})$")
_MAGIC = ((b"\xff\xd8\xff", ".jpg"), (b"\x89PNG", ".png"), (b"RIFF", ".webp"), (b"BM", ".bmp"),
          (b"II*\x00", ".tif"), (b"MM\x00*", ".tif"))


# ---- ids -------------------------------------------------------------------------------------


class Ids:
    """Opaque object ids: the row in hex and a keyed checksum of it. Nothing a client sends is
    ever used as a path: an id that is not one of ours is unknown (404)."""

    def __init__(self, key: bytes, count: int):
        self._key = key
        self._count = count

    def _tag(self, row: int) -> str:
        return hmac.new(self._key, str(row).encode(), hashlib.sha256).hexdigest()[:10]

    def make(self, row: int) -> str:
        return f"{row:x}-{self._tag(row)}"

    def row(self, oid: str) -> int | None:
        m = _ID.match(oid)
        if m is None:
            return None
        row = int(m.group(1), 16)
        if row >= self._count or not hmac.compare_digest(m.group(2), self._tag(row)):
            return None
        return row


# ---- languages -------------------------------------------------------------------------------


def catalogue_languages(fields: list[str]) -> list[str]:
    """The languages of the per-language columns (``title@fr`` → ``fr``), sorted."""
    return sorted({f.rsplit("@", 1)[1] for f in fields if "@" in f and f.rsplit("@", 1)[1]})


def language_preferences(lang: str | None) -> list[str]:
    """``fr-CA`` → ``["fr-ca", "fr"]`` (an Accept-Language list keeps its first tag); [] for none."""
    if not lang:
        return []
    tag = lang.split(",")[0].split(";")[0].strip()
    if not tag or tag == "*":
        return []
    if not _LANG.match(tag):
        raise ApiError(400, f"lang={lang[:40]!r} is not a language tag; use e.g. lang=fr or lang=pt-BR")
    tag = tag.lower().replace("_", "-")
    primary = tag.split("-")[0]
    return [tag] if tag == primary else [tag, primary]


def localize(metadata: dict[str, str], prefs: list[str]) -> dict[str, str]:
    """Metadata in the visitor's language: a per-language column (``title@fr``) replaces its base
    key (``title``) when it has a value; the per-language columns themselves are left out."""
    out = {k: v for k, v in metadata.items() if "@" not in k}
    if not prefs:
        return out
    best: dict[str, tuple[int, str]] = {}
    for key, value in metadata.items():
        if "@" not in key or not str(value).strip():
            continue
        base, lang = key.rsplit("@", 1)
        lang = lang.lower().replace("_", "-")
        if lang in prefs:
            rank = prefs.index(lang)
            if base not in best or rank < best[base][0]:
                best[base] = (rank, value)
    for base, (_, value) in best.items():
        out[base] = value
    return out


# ---- responses -------------------------------------------------------------------------------


#: The ``code`` of each error status: what the page words in the phone's language.
CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "too_slow", 413: "too_large",
         415: "not_an_image", 422: "bad_region", 429: "too_many", 431: "headers_too_large", 503: "busy"}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """``{"error": what went wrong and what to do, "code": its kind}`` (:data:`CODES`)."""
    return JSONResponse({"error": message, "code": CODES.get(status, "error")}, status_code=status, headers=headers)


#: A response sent before its request's body was read (a 413, a refused upload) waits for the rest
#: of the body, read and dropped, up to this many bytes and seconds (then the connection closes):
#: a client still sending then reads the answer instead of "connection reset" (nginx's lingering close).
DISCARD_LIMIT = 128 << 20
DISCARD_SECONDS = 30.0
#: the longest pause in a body being discarded
DISCARD_IDLE = 2.0


def head_size(scope: Scope) -> int:
    """The bytes of a request's head as sent: request line and headers."""
    line = len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 12
    return line + sum(len(k) + len(v) + 4 for k, v in scope["headers"])


class HttpMiddleware:
    """A pure ASGI middleware: :meth:`http` for HTTP requests, anything else passed on."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class RequestGuard(HttpMiddleware):
    """What every request goes through (pure ASGI):

    - a head over :data:`HEADER_LIMIT` bytes gets 431 (uvicorn's h11 checks only heads that arrive
      in pieces);
    - a body that ends early (fewer bytes than its ``Content-Length``, or the client closed its
      side: :class:`~museum_search.serve.server.GuardedH11`) raises a 400 :class:`ApiError`;
    - a response sent before the body was read (but a 408) is sent whole at once, then the rest of
      the body is read and dropped (:data:`DISCARD_LIMIT`, :data:`DISCARD_SECONDS`), and the
      connection closes: a client still uploading reads the 413 instead of a reset."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if head_size(scope) > HEADER_LIMIT:
            await error(431, f"the request's headers are too large (at most {HEADER_LIMIT >> 10} KB); send fewer "
                             "or shorter headers", {"Connection": "close"})(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        expected = int(length) if length.isdigit() else None
        body = {"more": bool(expected) or b"transfer-encoding" in headers, "received": 0, "hold": False}

        async def guarded_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body["received"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    body["more"] = False
                    cut = scope.get("extensions", {}).get("truncated")
                    if cut or (expected is not None and body["received"] < expected):
                        raise ApiError(400, f"the request's body is truncated ({body['received']} bytes of "
                                            f"{expected if expected is not None else 'more'}); send the photo again")
            elif message["type"] == "http.disconnect":
                body["more"] = False
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and body["more"] and message["status"] != 408:
                body["hold"] = True
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            if message["type"] == "http.response.body" and body["hold"] and not message.get("more_body", False):
                await send({**message, "more_body": True})
                await _discard(receive)
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(scope, guarded_receive, send=guarded_send)


async def _discard(receive: Receive) -> None:
    """Read and drop the rest of a request's body, within the :data:`DISCARD_LIMIT` bounds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DISCARD_SECONDS
    dropped = 0
    while dropped < DISCARD_LIMIT:
        wait = min(DISCARD_IDLE, deadline - loop.time())
        if wait <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), wait)
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        dropped += len(message.get("body", b""))


class SecurityHeaders(HttpMiddleware):
    """Adds the security headers to every response (pure ASGI: errors and static files too)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _query_name(filename: str) -> str:
    """The name an answer carries: the upload's file name (no folders, printable, short) or "photo"."""
    name = PurePosixPath(filename.replace("\\", "/")).name
    name = "".join(c for c in name if c.isprintable())[:100]
    return name or "photo"


#: the largest reference photo file served (read whole into memory before decoding)
MAX_PHOTO_FILE = 256 << 20


def read_under(root: Path, relative: str) -> bytes:
    """The bytes of the regular file ``relative`` under ``root``, resolved now, one folder at a
    time, and never through a symbolic link (``O_NOFOLLOW`` on every part, each opened relative to
    the folder before it): a link swapped in anywhere in the path, a FIFO or a device is an
    :class:`OSError`, never a file outside the collection."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    parts = PurePosixPath(relative).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PHOTO_FILE:
            raise OSError(f"{relative}: not a regular file of at most {MAX_PHOTO_FILE >> 20} MB")
        os.set_blocking(f.fileno(), True)
        return f.read(MAX_PHOTO_FILE + 1)


def _safe_relative(path: str) -> bool:
    p = PurePosixPath(path)
    return bool(path) and not p.is_absolute() and ".." not in p.parts and "\\" not in path and ":" not in p.parts[0]


# ---- errors: every one is JSON {"error": ...} ---------------------------------------------------


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error(exc.status, exc.message, exc.headers)


async def _busy(request: Request, exc: Busy) -> JSONResponse:
    return error(503, BUSY, {"Retry-After": "1"})


def client_address(request: Request) -> str:
    return request.client.host if request.client else ""


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        msg = f"nothing at {request.url.path[:100]}; the API is under /api (see /openapi.json)"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow", "")
        msg = f"{request.method} is not allowed on {request.url.path[:100]}; use {allowed or 'another method'}"
    else:
        msg = str(exc.detail)
    return error(exc.status_code, msg, dict(exc.headers or {}))


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = []
    for e in exc.errors()[:3]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("query", "path"))
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return error(400, "bad request: " + "; ".join(parts))


async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
    return error(400, "the client went away before sending the whole photo")


#: The app's exception handlers (:func:`create_app` installs them; so can a test's app).
EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]] = {
    ApiError: _api_error, Busy: _busy, StarletteHTTPException: _http_error, RequestValidationError: _invalid,
    ClientDisconnect: _gone,
}


# ---- the routes: each reads what it needs from request.app.state (see create_app) -----------------

router = APIRouter()


def decode_photo(upload: Upload, region: str | None = None) -> QueryImage:
    """The uploaded photo decoded (and cut to ``region``, "x,y,w,h" in its pixels, if given), before
    it takes a worker's place: :class:`ApiError` 415 for what is not an image, 422 for a bad region."""
    try:
        asked = None if region is None or not region.strip() else parse_region(region)
        return query_from_bytes(upload.data, _query_name(upload.filename), asked)
    except ImageError as exc:
        raise ApiError(415, f"{exc.reason}; send a photo (JPEG, PNG or WebP)") from None
    except RegionError as exc:
        raise ApiError(422, str(exc)) from None


def answer_photo(pipe: QueryPipeline, query: QueryImage, prefs: list[str], ids: Ids,
                 visitors: VisitorLog | None, decode_seconds: float = 0.0, language: str = "",
                 client: str = "") -> dict[str, Any]:
    """The answer to one decoded photo (:func:`decode_photo`), on a worker's ``pipe``:
    ``Answer.to_dict`` with opaque ids, metadata in the ``prefs`` languages, timings and the matched
    outline. ``visitors``: the answer is counted and its photo kept as its policy says (the photo's
    pixels re-encoded; ``language`` the visitor's, ``client`` the address for the rate limit only).
    ``objects``: every object found, its ``region`` a polygon in the uploaded photo's own pixels (the
    evidence's ``outline`` is in those of ``photo_size``, the photo as verified)."""
    t1 = time.perf_counter()
    answer = pipe.answer([query])[0]
    timings = dict(pipe.timings)
    assert query.image is not None
    h, w = query.image.shape[:2]
    # the evidence the verdict judged (if verified): the matched outline in the photo's pixels
    corners = outline_in_photo(pipe.top_matches(query, answer), (w, h))
    outline = None if corners is None else [[round(float(x), 1), round(float(y), 1)] for x, y in corners]
    if visitors is not None:
        _record(visitors, answer, query, language, client)
    t2 = time.perf_counter()
    doc = answer.to_dict()
    doc["confidence_band"] = confidence_band(answer.confidence)  # the page words it, keyed by band
    results = []
    for r, d in zip(answer.results, doc["results"]):
        oid = ids.make(r.row)
        results.append({"rank": d["rank"], "score": d["score"], "cosine": d["cosine"], "inliers": d["inliers"],
                        "id": oid, "image": f"/api/objects/{oid}/image", "instance": d["instance"],
                        "metadata": localize(d["metadata"], prefs)})
    doc["results"] = results
    for o, d in zip(answer.objects, doc["objects"]):
        oid = ids.make(o.result.row)
        d.update(id=oid, image=f"/api/objects/{oid}/image", metadata=localize(dict(o.result.metadata), prefs),
                 confidence_band=confidence_band(o.confidence))
    doc["timing"] = {"decode_ms": _ms(decode_seconds), "describe_ms": _ms(timings.get("describe", 0.0)),
                     "search_ms": _ms(timings.get("search", 0.0)), "verify_ms": _ms(timings.get("verify", 0.0)),
                     "total_ms": _ms(decode_seconds + t2 - t1)}
    doc["evidence"] = {"photo_size": [int(w), int(h)], "outline": outline}
    return doc


@router.post("/api/identify", summary="Which object does this photo show?", openapi_extra={
    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["photo"],
        "properties": {"photo": {"type": "string", "format": "binary"}}}}}},
    "responses": {"400": {"description": "no photo, truncated body"}, "408": {"description": "too slow"},
                  "413": {"description": "too large"}, "415": {"description": "not an image"},
                  "503": {"description": "busy: retry after Retry-After seconds"}}})
async def identify(request: Request, lang: str | None = Query(None, max_length=100),
                   region: str | None = Query(None, max_length=200, description=(
                       "only this part of the photo: x,y,w,h in its pixels (left, top, width, height)"))
                   ) -> JSONResponse:
    state = request.app.state
    prefs = language_preferences(lang)
    if region is not None and region.strip():
        try:
            parse_region(region)  # a malformed region is refused before the photo is read
        except RegionError as exc:
            raise ApiError(422, str(exc)) from None
    shares = getattr(state, "shares", None) or Shares()
    with shares.hold(client_address(request)):  # this address's share of the uploads
        upload = await read_photo(request, state.max_upload, state.body_timeout)
        state.pool.check_room()  # refused at once when full, before decoding for nothing
        t0 = time.perf_counter()
        query = await anyio.to_thread.run_sync(decode_photo, upload, region, limiter=state.decode_limiter)
        decoded = time.perf_counter() - t0
        with state.pool.admission():  # a worker's place only once the photo is here and decoded
            doc = await state.pool.run(answer_photo, query, prefs, state.ids, state.visitors, decoded,
                                       visitor_language(request, prefs), client_address(request))
    return JSONResponse(doc)


def item_doc(ids: Ids, row: int, item, prefs: list[str]) -> dict[str, Any]:
    """One catalogue object as the API gives it: opaque id, instance, localized metadata, image URL."""
    oid = ids.make(row)
    return {"id": oid, "instance": item.instance, "metadata": localize(dict(item.metadata), prefs),
            "image": f"/api/objects/{oid}/image"}


@router.get("/api/info", summary="The collection")
async def info(request: Request, lang: str | None = Query(None, max_length=100)) -> dict[str, Any]:
    state = request.app.state
    prefs = language_preferences(lang)
    keep = getattr(state, "keep", None)
    return {"name": state.index.root.name, "objects": len(state.index.instances), "references": len(state.index),
            "languages": state.languages, "version": __version__,
            # the side the answer is computed from: the phone page scales a larger photo down to it
            "photo_side": int(QueryPipeline.verify_side),
            # what is kept of a visitor's photo, in one plain line in the visitor's language (None: nothing)
            "notice": None if keep is None else keep.notice(prefs[-1] if prefs else "en")}


@router.get("/healthz", summary="Liveness and load")
async def healthz(request: Request) -> dict[str, Any]:
    pool = request.app.state.pool
    return {"status": "ok", "references": len(request.app.state.index), "workers": pool.workers, "busy": pool.busy,
            "queued": pool.queued}


def catalogue_page(catalogue, ids: Ids, q: str, page: int, per_page: int, prefs: list[str]) -> dict[str, Any]:
    """Page ``page`` of the catalogue objects that match the full text ``q`` (all of them for "")."""
    rows = catalogue.match(q)
    total = len(catalogue) if rows is None else len(rows)
    lo = min(total, (page - 1) * per_page)
    hi = min(total, lo + per_page)
    chosen = list(range(lo, hi)) if rows is None else [int(r) for r in rows[lo:hi]]
    items = catalogue.rows(chosen)
    return {"total": total, "page": page, "per_page": per_page,
            "items": [item_doc(ids, r, it, prefs) for r, it in zip(chosen, items)]}


@router.get("/api/objects", summary="The catalogue, filtered by full text and paginated")
async def objects(request: Request, q: str = Query("", max_length=200), page: int = Query(1, ge=1, le=1_000_000),
                  per_page: int = Query(20, ge=1, le=100),
                  lang: str | None = Query(None, max_length=100)) -> dict[str, Any]:
    state = request.app.state
    prefs = language_preferences(lang)
    return await anyio.to_thread.run_sync(lambda: catalogue_page(state.catalogue, state.ids, q, page, per_page, prefs),
                                          limiter=state.image_limiter)


def row_of(ids: Ids, oid: str) -> int:
    """The row of an id of ours; :class:`ApiError` 404 for any other."""
    row = ids.row(oid)
    if row is None:
        raise ApiError(404, "no object has this id; ids come from /api/objects or /api/identify")
    return row


@router.get("/api/objects/{oid}", summary="One object")
async def one_object(request: Request, oid: str, lang: str | None = Query(None, max_length=100)) -> dict[str, Any]:
    state = request.app.state
    prefs = language_preferences(lang)
    row = row_of(state.ids, oid)
    item = await anyio.to_thread.run_sync(lambda: state.catalogue[row], limiter=state.image_limiter)
    return item_doc(state.ids, row, item, prefs)


def shown_rows(items) -> dict[int, int]:
    """For each reference whose photo lives outside the collection folder (a visitor's photo staff
    confirmed, kept in the visitors folder: never served), the row of a photo of the same object in
    the collection, shown in its place."""
    first: dict[str, int] = {}
    outside = []
    for row, item in enumerate(items):
        if _safe_relative(item.path):
            first.setdefault(item.instance, row)
        else:
            outside.append(row)
    return {row: first[items[row].instance] for row in outside if items[row].instance in first}


def object_jpeg(catalogue, root: Path, row: int, size: int) -> bytes:
    """The photo of catalogue row ``row`` as a JPEG of longest side ``size`` at most; ApiError 404
    for a photo outside the collection folder or unreadable."""
    item = catalogue[row]
    if not _safe_relative(item.path):
        raise ApiError(404, "this object's photo is not in the collection folder")
    try:
        data = read_under(root, item.path)
    except OSError:
        raise ApiError(404, "this object's photo is not a file of the collection folder (a link, or gone)") from None
    try:
        rgb = decode_image(data, item.path, max_side=size)
    except ImageError as exc:
        raise ApiError(404, f"this object's photo cannot be read ({exc.reason})") from None
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 85])
    if not ok:
        raise ApiError(500, "the photo could not be encoded")
    return buf.tobytes()


@router.get("/api/objects/{oid}/image", summary="The object's photo as a JPEG, scaled down",
            response_class=Response, responses={200: {"content": {"image/jpeg": {}}}})
async def object_image(request: Request, oid: str,
                       size: int = Query(512, ge=IMAGE_SIZES[0], le=IMAGE_SIZES[1])) -> Response:
    state = request.app.state
    row = row_of(state.ids, oid)
    etag = f'"{oid}-{size}"'
    cache = {"Cache-Control": "public, max-age=3600", "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=cache)
    row = getattr(state, "shown", {}).get(row, row)  # a staff-confirmed view: a photo of its object instead
    data = await anyio.to_thread.run_sync(lambda: object_jpeg(state.catalogue, state.index.root, row, size),
                                          limiter=state.image_limiter)
    return Response(data, media_type="image/jpeg", headers=cache)


# ---- the visitor page ----------------------------------------------------------------------------


@router.get("/", include_in_schema=False)
async def page() -> Response:
    f = STATIC / "index.html"
    if not f.is_file():
        return error(404, "the visitor page is not installed (museum_search/serve/static/index.html)")
    return FileResponse(f, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-cache"})


# ---- the app -------------------------------------------------------------------------------------


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.pool.shutdown()
    if app.state.visitors is not None:
        app.state.visitors.close()


def create_app(index_path: str | os.PathLike, *, workers: int | None = None, queue: int | None = None,
               max_upload: int = 20 << 20, allow_origin: str | None = None,
               keep: KeepPolicy | None = None, visitors: str | os.PathLike | None = None,
               body_timeout: float = 10.0, settings: QuerySettings | None = None) -> FastAPI:
    """The ASGI app of ``museum-search serve`` for the index at ``index_path``.

    The index is loaded once, and ``workers`` pipelines (default: one per core) are built on it,
    sharing its network, and warmed up before this returns. ``queue`` requests (default 2 ×
    workers) may wait beyond the workers; more get 503 with ``Retry-After``. ``keep``: what is
    counted and kept of visitors' questions (default :class:`KeepPolicy`: anonymous counts, no
    photo), in the folder ``visitors`` (default: beside the index).

    The routes (:data:`router`) read everything from ``app.state``: ``index``, ``pool`` (the
    :class:`WorkerPool` of pipelines), ``ids``, ``catalogue``, ``languages``, ``keep`` (the policy),
    ``visitors`` (the :class:`VisitorLog` or None), ``image_limiter`` (threads for catalogue and image work),
    ``max_upload`` and ``body_timeout``."""
    n = max(1, int(workers or os.cpu_count() or 1))
    waiting = 2 * n if queue is None else max(0, int(queue))
    if max_upload <= 0 or body_timeout <= 0:
        raise ValueError("max_upload and body_timeout must be positive")
    index = Index.load(index_path)
    policy = keep or KeepPolicy()
    visitor_log = open_visitors(Path(index_path), policy, visitors)  # refused before the long warm-up
    first = QueryPipeline(index, settings)
    pipelines = [first] + [QueryPipeline(index, settings, extractor=first.extractor) for _ in range(n - 1)]
    pool = WorkerPool(pipelines, waiting)
    pool.run_each(lambda p: p.warm_up())
    catalogue = index.catalogue()
    key_source = f"{Path(index_path).resolve()}|{getattr(catalogue, 'path', '')}|{len(index)}"

    app = FastAPI(title="museum-search", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", lifespan=_lifespan,
                  description="Which object of the collection does this photo show? The answers of "
                              "`museum-search query --json`, for visitors' phones.")
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.state.index = index
    app.state.pool = pool
    app.state.ids = Ids(hashlib.sha256(b"museum-search serve ids|" + key_source.encode()).digest(), len(index))
    app.state.catalogue = catalogue
    app.state.languages = catalogue_languages(list(catalogue.fields))
    app.state.keep, app.state.visitors = policy, visitor_log
    app.state.shown = shown_rows(index.items)
    app.state.image_limiter = anyio.CapacityLimiter(n)
    app.state.decode_limiter = anyio.CapacityLimiter(n)  # photos decoded at once, before a worker's place
    app.state.max_upload, app.state.body_timeout = max_upload, body_timeout
    app.state.shares = Shares()
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")

    app.add_middleware(RequestGuard)
    app.add_middleware(SecurityHeaders)
    if allow_origin:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=[allow_origin], allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type"], max_age=600)
    return app


def _ms(seconds: float) -> float:
    return round(1000.0 * seconds, 1)


def _record(visitors: VisitorLog, answer, query: QueryImage, language: str, client: str) -> None:
    """Counts the answer and keeps its photo as the policy says; a failure to do so is logged and
    never costs the visitor the answer."""
    try:
        visitors.record(answer, source="phone", language=language, image=query.image, client=client)
    except Exception as exc:  # the answer is sent whatever the log's trouble
        log.warning("could not record a visitor's question: %s", exc)


def visitor_language(request: Request, prefs: list[str]) -> str:
    """The visitor's language, as counted: the page's ``lang``, else the phone's Accept-Language
    (its first primary tag, e.g. "fr"); "" when unknown."""
    if prefs:
        return prefs[-1]
    try:
        tags = language_preferences(request.headers.get("accept-language", "")[:100])
    except ApiError:
        return ""
    return tags[-1] if tags else ""


def open_visitors(index_path: Path, policy: KeepPolicy, folder: str | os.PathLike | None) -> VisitorLog | None:
    """The index's visitor log as ``policy`` asks (None when it keeps and counts nothing). When only
    counting is asked and the folder cannot be made (a read-only disk), the service runs without
    counts, with a warning; when photos are to be kept, that is an error."""
    if policy.keep == "none" and not policy.counting:
        return None
    try:
        return VisitorLog.open(index_path, policy, folder=folder)
    except MuseumSearchError as exc:
        if policy.keep != "none":
            raise
        log.warning("visitors' questions are not counted: %s", exc)
        return None
