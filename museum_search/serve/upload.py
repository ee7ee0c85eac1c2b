"""Reading the visitor's photo from a ``multipart/form-data`` body, with limits.

The body is read as it arrives (never more than ``max_upload`` bytes: the announced
``Content-Length`` is checked first, then the bytes are counted), parsed on the fly, and only the
``photo`` field is kept, in memory (nothing is spooled to disk). A client that stops sending for
``body_timeout`` seconds, or takes longer than :data:`BODY_DEADLINE` × ``body_timeout`` for the
whole body, or whose body comes slower than :data:`MIN_RATE` on average after :data:`RATE_GRACE`
seconds (a trickle), gets 408. Each client address has :data:`ADDRESS_UPLOADS` uploads under way at
most (:class:`Shares`); a worker's place is taken only once the whole photo is here (``app.identify``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

#: the whole body must arrive within this many body timeouts (a drip of a byte a second never ends)
BODY_DEADLINE = 6
#: after :data:`RATE_GRACE` seconds, a body must have come at this many bytes a second on average
#: (a phone on weak Wi-Fi sends tens of KB/s; a trickle that holds a connection is dropped early)
MIN_RATE = 4096
RATE_GRACE = 5.0
#: uploads one client address may have under way at once (received, waiting or answered)
ADDRESS_UPLOADS = 4
FIELD = "photo"


class ApiError(Exception):
    """A request the API refuses: its status and a message saying what to do."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Shares:
    """Each client address's uploads under way: at most :data:`ADDRESS_UPLOADS` at once, so one
    phone cannot hold more than its share (beyond: 429 with ``Retry-After``)."""

    def __init__(self, per_address: int = ADDRESS_UPLOADS):
        self.per_address = per_address
        self._held: dict[str, int] = {}

    @contextmanager
    def hold(self, address: str) -> Iterator[None]:
        if self._held.get(address, 0) >= self.per_address:
            raise ApiError(429, f"this device already sends {self.per_address} photos; wait for their answers",
                           {"Retry-After": "1"})
        self._held[address] = self._held.get(address, 0) + 1
        try:
            yield
        finally:
            self._held[address] -= 1
            if not self._held[address]:
                del self._held[address]


@dataclass
class Upload:
    data: bytes
    filename: str


def _megabytes(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB" if n >= 1 << 20 else f"{n} bytes"


class _Parts:
    """python-multipart callbacks that keep the first ``photo`` field."""

    def __init__(self) -> None:
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.headers: dict[bytes, bytes] = {}
        self.current: bytearray | None = None
        self.found: bytearray | None = None
        self.filename = ""
        self.ended = False

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self.part_begin, "on_header_field": self.field, "on_header_value": self.value,
            "on_header_end": self.header_end, "on_headers_finished": self.headers_finished,
            "on_part_data": self.data, "on_part_end": self.part_end, "on_end": self.end,
        }

    def part_begin(self) -> None:
        self.headers = {}
        self.current = None

    def field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def header_end(self) -> None:
        self.headers[bytes(self.header_field).lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        if options.get(b"name") == FIELD.encode() and self.found is None:
            self.current = bytearray()
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace")

    def data(self, data: bytes, start: int, end: int) -> None:
        if self.current is not None:
            self.current += data[start:end]

    def part_end(self) -> None:
        if self.current is not None:
            self.found, self.current = self.current, None

    def end(self) -> None:
        self.ended = True


async def read_photo(request: Request, max_upload: int, body_timeout: float) -> Upload:
    """The ``photo`` field of the request's multipart body; :class:`ApiError` for anything else."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiError(400, "the Content-Length header is not a number")
        if int(length) > max_upload:
            raise ApiError(413, f"the photo is too large ({_megabytes(int(length))}); send at most "
                                f"{_megabytes(max_upload)} (a phone photo is a few MB)")
    ctype, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise ApiError(400, f"send the photo as multipart/form-data in a field named '{FIELD}'")
    parts = _Parts()
    try:
        parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
    except ValueError as exc:
        raise ApiError(400, f"the multipart boundary is not valid ({exc})") from None
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + BODY_DEADLINE * body_timeout
    received = 0
    while True:
        slow = start + max(RATE_GRACE, (received + 1) / MIN_RATE)  # when the average falls under MIN_RATE
        wait = min(body_timeout, deadline - loop.time(), slow - loop.time())
        try:
            if wait <= 0:
                raise TimeoutError
            message = await asyncio.wait_for(request.receive(), wait)
        except TimeoutError:
            raise ApiError(408, "the photo arrived too slowly; check the connection and send it again") from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > max_upload:
            raise ApiError(413, f"the photo is too large (more than {_megabytes(max_upload)}); send a smaller one")
        if chunk:
            try:
                parser.write(chunk)
            except Exception as exc:  # python-multipart's MultipartParseError and friends
                raise ApiError(400, f"the multipart body cannot be read ({exc}); send the photo again") from None
        if not message.get("more_body", False):
            break
    if not parts.ended:
        raise ApiError(400, "the multipart body is truncated (it has no closing boundary); send the photo again")
    if parts.found is None:
        raise ApiError(400, f"no '{FIELD}' field in the form; send the photo in a field named '{FIELD}'")
    if not parts.found:
        raise ApiError(400, f"the '{FIELD}' field is empty; take or choose a photo and send it")
    return Upload(bytes(parts.found), parts.filename)
