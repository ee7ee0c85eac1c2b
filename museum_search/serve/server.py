"""Running the app with uvicorn, and getting visitors there: the URLs, a QR code in the terminal,
a printable label (PNG or PDF)."""

from __future__ import annotations

import asyncio
import io
import os
import socket
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


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, closing connections that do not send their headers within
    :data:`HEADER_TIMEOUT` seconds (the body has its own timeout in the app)."""

    header_timeout = HEADER_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

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
        if self._waiting_for_headers():
            self._arm()
        super().data_received(data)
        if not self._waiting_for_headers():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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


#: Open connections served at once (file descriptors stay well under the usual limit of 1,024).
MAX_CONNECTIONS = 512


def run(app, host: str, port: int, *, certfile: str | None = None, keyfile: str | None = None,
        capacity: int = 8, log_level: str = "warning") -> None:
    """Serve ``app`` with uvicorn: keep-alive and header timeouts, a header size limit, and at most
    :data:`MAX_CONNECTIONS` connections at once. The crowd is bounded by the app's own admission
    (``capacity``: workers + queue, a JSON 503 with ``Retry-After`` beyond); the connection limit is
    only a guard against a flood of open sockets, far above what a crowd of phones keeps open (each
    keeps its connection alive between photos): below it, uvicorn's own plain 503 without
    ``Retry-After`` reached visitors at 64 phones (bench/bench_serve.py)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, http=GuardedH11, timeout_keep_alive=KEEP_ALIVE,
                            h11_max_incomplete_event_size=HEADER_LIMIT, limit_concurrency=max(MAX_CONNECTIONS, 16 * capacity),
                            ssl_certfile=certfile, ssl_keyfile=keyfile, log_level=log_level, server_header=False,
                            proxy_headers=False, access_log=False)
    uvicorn.Server(config).run()
