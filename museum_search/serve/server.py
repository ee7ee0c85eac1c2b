"""Running the app with uvicorn, and getting visitors there: the URLs, a QR code in the terminal,
a printable label (PNG or PDF)."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import socket
from http import HTTPStatus
from pathlib import Path
from typing import Any

import segno
from uvicorn.protocols.http.h11_impl import H11Protocol

from museum_search.core.errors import MuseumSearchError

#: seconds a client has to send a request's headers (uvicorn has no such limit: slowloris)
HEADER_TIMEOUT = 10.0
#: the largest request head (request line and headers) accepted, in bytes
HEADER_LIMIT = 16 << 10
KEEP_ALIVE = 5
LABEL_TEXT = "Point your camera here"


#: Open connections served at once (file descriptors stay well under the usual limit of 1,024).
MAX_CONNECTIONS = 512
#: open connections from one client address (a browser opens up to 6 to a host)
ADDRESS_CONNECTIONS = 16
#: seconds a refused connection may linger (its request is read and dropped) before it is closed
REFUSED_LINGER = 1.0


def json_response(status: int, message: str, code: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response with the API's JSON error body, closing the connection."""
    body = json.dumps({"error": message, "code": code}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the limits a room full of phones needs:

    - a connection must send its request's headers within :data:`HEADER_TIMEOUT` seconds;
    - at most :attr:`max_connections` connections, :data:`ADDRESS_CONNECTIONS` per client address;
      at the cap, the oldest idle connection (waiting for a request's headers) of the address with
      the most connections is closed to make room, and when none is idle the newcomer gets a JSON 503 (429 for its address's share)
      with ``Retry-After``, never uvicorn's plain-text 503;
    - a client that closes its side in the middle of a body gets its 400 (the app reads
      ``truncated`` on the request message);
    - a request head that cannot be read gets a JSON 400, one over :data:`HEADER_LIMIT` a 431."""

    header_timeout = HEADER_TIMEOUT
    max_connections = MAX_CONNECTIONS
    address_connections = ADDRESS_CONNECTIONS
    #: every open connection of this server (a subclass per server: :func:`run`), oldest first
    registry: dict = {}

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False
        super().connection_made(transport)
        refusal = self._admit()
        if refusal is not None:
            self._refuse(*refusal)
            return
        type(self).registry[self] = None
        self._arm()

    def _address(self) -> str:
        return self.client[0] if self.client else ""

    def _admit(self) -> tuple[int, str, str] | None:
        """None if this connection may stay, else the refusal (status, message, code)."""
        live = type(self).registry
        mine = sum(1 for c in live if c._address() == self._address())
        if mine >= self.address_connections:
            return (429, f"too many connections from this address (at most {self.address_connections}); "
                         "close some and try again", "too_many")
        if len(live) >= self.max_connections:
            idle = [c for c in live if c._waiting_for_headers()]
            if not idle:
                return (503, "busy, try again", "busy")
            counts: dict[str, int] = {}
            for c in live:
                counts[c._address()] = counts.get(c._address(), 0) + 1
            oldest = max(idle, key=lambda c: counts[c._address()])  # the most connected address's oldest
            live.pop(oldest, None)
            oldest.transport.close()
        return None

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._refused = True
        self.connections.discard(self)
        self.transport.write(json_response(status, message, code, retry_after=1))
        try:
            self.transport.write_eof()
        except (NotImplementedError, RuntimeError, OSError):  # TLS cannot half-close
            pass
        self.loop.call_later(REFUSED_LINGER, self.transport.close)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: the refusal is already sent
        if self._waiting_for_headers():
            self._arm()
        super().data_received(data)
        if not self._waiting_for_headers():
            self._disarm()

    def eof_received(self) -> bool | None:
        """The client closed its side: in the middle of a body, the app is told (the request
        message carries ``truncated``) and may still answer; otherwise the connection closes."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.more_body or self._refused:
            return None
        cycle.more_body = False
        cycle.keep_alive = False
        cycle.scope.setdefault("extensions", {})["truncated"] = True  # type: ignore[typeddict-unknown-key]
        cycle.message_event.set()
        return True

    def send_400_response(self, msg: str) -> None:
        """A request that h11 cannot read: JSON, 431 when its head is over :data:`HEADER_LIMIT`."""
        if len(self.conn.trailing_data[0]) > HEADER_LIMIT:
            out = json_response(431, f"the request's headers are too large (at most {HEADER_LIMIT >> 10} KB); "
                                     "send fewer or shorter headers", "headers_too_large")
        else:
            out = json_response(400, "the request cannot be read as HTTP/1.1", "bad_request")
        self.transport.write(out)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        type(self).registry.pop(self, None)
        super().connection_lost(exc)


def lan_address() -> str | None:
    """This machine's address on the local network (the interface of the default route), or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent (UDP connect only picks a route)
        addr = s.getsockname()[0]
        return None if addr.startswith("127.") else addr
    except OSError:
        return None
    finally:
        s.close()


def urls(host: str, port: int, https: bool) -> list[str]:
    """The URLs visitors (first) and this machine can open."""
    scheme = "https" if https else "http"
    default = 443 if https else 80
    tail = "" if port == default else f":{port}"
    if host in ("0.0.0.0", "::", ""):
        lan = lan_address()
        hosts = ([lan] if lan else []) + ["127.0.0.1"]
    else:
        hosts = [f"[{host}]" if ":" in host else host]
    return [f"{scheme}://{h}{tail}/" for h in hosts]


def terminal_qr(url: str) -> str:
    out = io.StringIO()
    segno.make(url, error="m").terminal(out=out, compact=True)
    return out.getvalue()


def write_label(path: str | os.PathLike, url: str, name: str) -> Path:
    """A printable label: the QR code of ``url`` with the collection's ``name`` and "Point your
    camera here" under it, as PNG or PDF (by the file's extension). An existing file is never
    overwritten (it is created exclusively)."""
    from PIL import Image, ImageDraw, ImageFont

    path = Path(path)
    kind = path.suffix.lower()
    if kind not in (".png", ".pdf"):
        raise MuseumSearchError(f"--label {path}: give a .png or .pdf file name")
    if path.exists() or path.is_symlink():
        raise MuseumSearchError(f"--label {path}: this file exists already; it is left as it is (choose "
                                "another name, or delete it first)")
    buf = io.BytesIO()
    segno.make(url, error="m").save(buf, kind="png", scale=16, border=4)
    qr = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    w = qr.width
    lines = [name, LABEL_TEXT, url]
    sizes = [max(18, w // 14), max(16, w // 18), max(12, w // 30)]
    fonts: list[Any] = []
    for s in sizes:
        try:
            fonts.append(ImageFont.load_default(size=s))
        except TypeError:  # Pillow < 10.1 has one bitmap font
            fonts.append(ImageFont.load_default())
    pad = w // 20
    height = qr.height + pad + sum(int(s * 1.4) for s in sizes) + pad
    label = Image.new("RGB", (w, height), "white")
    label.paste(qr, (0, 0))
    draw = ImageDraw.Draw(label)
    y = qr.height
    for text, font, s in zip(lines, fonts, sizes):
        tw = draw.textlength(text, font=font)
        draw.text(((w - tw) / 2, y), text, fill="black", font=font)
        y += int(s * 1.4)
    out = io.BytesIO()
    if kind == ".png":
        label.save(out, "PNG")
    else:
        label.save(out, "PDF", resolution=200.0)
    try:
        with open(path, "xb") as f:
            f.write(out.getvalue())
    except FileExistsError:
        raise MuseumSearchError(f"--label {path}: this file exists already; it is left as it is") from None
    return path


def listen(host: str, port: int) -> socket.socket:
    """The listening socket of ``serve`` (bound before anything is printed, so a port in use or not
    permitted is said at once); :class:`MuseumSearchError` saying what to do."""
    if not 0 <= port <= 65535:
        raise MuseumSearchError(f"--port {port}: give a port from 1 to 65535")
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise MuseumSearchError(f"--host {host}: this address cannot be used ({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise MuseumSearchError(f"port {port} is in use on {host} (another server?); stop it or give another "
                                    "--port") from None
        if exc.errno == errno.EACCES:
            raise MuseumSearchError(f"port {port} needs administrator rights on this system; give a --port "
                                    "above 1023") from None
        raise MuseumSearchError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None
    sock.set_inheritable(True)
    return sock


def protocol(max_connections: int = MAX_CONNECTIONS) -> type[GuardedH11]:
    """A :class:`GuardedH11` with a registry of its own (one per server)."""
    return type("ServeH11", (GuardedH11,), {"registry": {}, "max_connections": max_connections})


def run(app, sock: socket.socket, *, certfile: str | None = None, keyfile: str | None = None,
        log_level: str = "warning", max_connections: int = MAX_CONNECTIONS) -> None:
    """Serve ``app`` with uvicorn on the listening ``sock`` (:func:`listen`): keep-alive and header
    timeouts, a header size limit, and the connection limits of :class:`GuardedH11` (uvicorn's
    own ``limit_concurrency``, a plain-text 503 without ``Retry-After``, is off). The crowd is
    bounded by the app's own admission (workers + queue, a JSON 503 with ``Retry-After`` beyond)."""
    import uvicorn

    config = uvicorn.Config(app, http=protocol(max_connections), timeout_keep_alive=KEEP_ALIVE,
                            h11_max_incomplete_event_size=HEADER_LIMIT, limit_concurrency=None,
                            ssl_certfile=certfile, ssl_keyfile=keyfile, log_level=log_level, server_header=False,
                            proxy_headers=False, access_log=False)
    server = uvicorn.Server(config)
    run.server = server  # type: ignore[attr-defined]  # a test's thread stops it (should_exit)
    server.run(sockets=[sock])
