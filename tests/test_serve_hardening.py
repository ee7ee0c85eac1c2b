"""``serve`` against one visitor who would deny it to all (issue 33, cases 1-8): slow uploads,
idle connections, a 50 MB upload, a truncated body, huge headers, bad ``--port`` / ``--workers``,
and a photo path swapped for a link. The real server (``serve.server.run``: uvicorn with
:class:`GuardedH11`) runs on a loopback port; clients come from several loopback addresses
(127.0.0.x). Each test fails on the code before issue 33."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from museum_search.serve import create_app
from museum_search.serve import server as serve_server
from museum_search.serve.app import object_jpeg
from museum_search.serve.upload import ApiError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
BOUNDARY = b"xyz"


def multipart(data: bytes) -> bytes:
    return (b"--xyz\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.jpg\"\r\n"
            b"Content-Type: image/jpeg\r\n\r\n" + data + b"\r\n--xyz--\r\n")


def post_head(length: int) -> bytes:
    return (f"POST /api/identify HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=xyz\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def read_response(s: socket.socket, timeout: float = 30) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of the one response on ``s``."""
    s.settimeout(timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = s.recv(65536)
        assert chunk, f"closed without an answer: {raw[:200]!r}"
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    n = int(headers["content-length"])
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "closed in the middle of the answer"
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest[:n])


def connect(addr, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(addr)
    return s


@pytest.fixture(scope="module")
def served(sample_index):
    """The app (1 worker, 1 queued) under ``serve.server.run`` on a loopback port, with a cap of 40
    connections: (host, port)."""
    app = create_app(sample_index.path, workers=1, queue=1, max_upload=1 << 20, body_timeout=30.0)
    sock = serve_server.listen("127.0.0.1", 0)
    t = threading.Thread(target=serve_server.run, args=(app, sock), kwargs={"log_level": "error",
                                                                           "max_connections": 40}, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not getattr(getattr(serve_server.run, "server", None), "started", False):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield sock.getsockname()
    serve_server.run.server.should_exit = True
    t.join(10)


def identify(addr, data: bytes, source: str = "127.0.0.1") -> tuple[int, dict]:
    s = connect(addr, source)
    try:
        body = multipart(data)
        s.sendall(post_head(len(body)) + body)
        status, _, doc = read_response(s, 120)
        return status, doc
    finally:
        s.close()


def test_slow_uploads_hold_no_worker_and_a_trickle_is_dropped_early(served, sample_collection):
    """Case 1: slow bodies from three addresses while an honest phone asks (1 worker + 1 queued:
    before, each slow body held one of the 2 places and the phone got 503 'busy')."""
    photo = (sample_collection / "queries" / "q02.jpg").read_bytes()
    body = multipart(photo)
    slow = []
    for i in range(3):
        s = connect(served, f"127.0.0.{2 + i}")
        s.sendall(post_head(len(body)) + body[:100])  # and then nothing for now
        slow.append(s)

    time.sleep(0.3)
    status, doc = identify(served, photo)
    assert status == 200 and doc["in_collection"], doc
    for s in slow:
        s.close()
    # a trickle (a byte every 0.2 s: 5 B/s) gets 408 once the minimum rate applies, long before the 30 s timeout
    s = connect(served, "127.0.0.9")
    s.sendall(post_head(len(body)) + body[:50])
    got = None
    t0 = time.monotonic()
    try:
        for k in range(50, 400):
            s.sendall(body[k:k + 1])
            time.sleep(0.2)
    except OSError:
        pass
    try:
        got = read_response(s, 5)
    finally:
        s.close()
    assert got[0] == 408 and got[2]["code"] == "too_slow" and time.monotonic() - t0 < 60


def test_idle_connections_cannot_shut_it_and_refusals_are_json(served):
    """Case 2: 60 idle connections (half-sent headers) on a cap of 40: a visitor is still answered
    (the longest idle is closed for it); one address's 17th connection gets a JSON 429."""
    idle = []
    try:
        for i in range(60):
            s = connect(served, f"127.0.1.{i % 6 + 1}")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            idle.append(s)
        s = connect(served)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, doc = read_response(s)
        s.close()
        assert status == 200 and doc["status"] == "ok"
    finally:
        for s in idle:
            s.close()
    time.sleep(0.5)
    mine = [connect(served, "127.0.2.1") for _ in range(serve_server.ADDRESS_CONNECTIONS)]
    extra = connect(served, "127.0.2.1")
    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, doc = read_response(extra)
    assert status == 429 and headers["retry-after"] == "1" and doc["code"] == "too_many"
    for c in mine + [extra]:
        c.close()


def test_a_too_large_upload_gets_a_413_the_client_can_read(served):
    """Case 3: urllib sends 50 MB (the limit here is 1 MB) and reads the 413's JSON (before:
    'Connection reset by peer' or 'Broken pipe')."""
    body = multipart(os.urandom(50 << 20))
    req = urllib.request.Request(f"http://{served[0]}:{served[1]}/api/identify", data=body,
                                 headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    with pytest.raises(urllib.error.HTTPError) as got:
        urllib.request.urlopen(req, timeout=60)
    assert got.value.code == 413
    doc = json.loads(got.value.read())
    assert doc["code"] == "too_large" and "too large" in doc["error"]


def test_a_truncated_body_then_a_closed_side_gets_400(served, sample_collection):
    """Case 4: half a body, then the client shuts its sending side: a JSON 400 (before: nothing)."""
    body = multipart((sample_collection / "queries" / "q02.jpg").read_bytes())
    s = connect(served)
    s.sendall(post_head(len(body)) + body[: len(body) // 2])
    s.shutdown(socket.SHUT_WR)
    status, _, doc = read_response(s)
    s.close()
    assert status == 400 and doc["code"] == "bad_request" and "truncated" in doc["error"]


@pytest.mark.parametrize("pieces", [1, 20])
def test_headers_over_the_limit_get_431(served, pieces):
    """Case 5: a 65,000-byte header, sent whole (before: 200) or in pieces (before: plain text 400)."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65000 + b"\r\n\r\n"
    s = connect(served)
    step = -(-len(head) // pieces)
    try:
        for k in range(0, len(head), step):
            s.sendall(head[k:k + step])
            time.sleep(0.02 if pieces > 1 else 0)
    except OSError:
        pass
    status, _, doc = read_response(s)
    s.close()
    assert status == 431 and doc["code"] == "headers_too_large"


def test_port_and_workers_are_checked_before_anything_is_printed(sample_index, capsys):
    """Cases 6 and 7: --port 99999 and --workers 0 are usage errors (exit 2); a port in use exits 1
    with what to do, before 'serving … at' (before: a traceback, exit 3, --workers 0 ignored)."""
    from museum_search.cli import main

    for argv in (["--port", "99999"], ["--port", "0"], ["--workers", "0"], ["--queue", "-1"]):
        with pytest.raises(SystemExit) as ex:
            main(["serve", str(sample_index.path), *argv])
        assert ex.value.code == 2
        out = capsys.readouterr()
        assert out.out == "" and "out of range" in out.err, (argv, out)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        assert main(["serve", str(sample_index.path), "--port", str(busy.getsockname()[1])]) == 1
    finally:
        busy.close()
    out = capsys.readouterr()
    assert out.out == "" and "is in use" in out.err and "--port" in out.err and "Traceback" not in out.err


def test_only_the_collections_own_files_are_served(tmp_path, sample_collection):
    """Case 8: a photo, a link swapped in for it to a file outside, and a folder of the path
    swapped for a link: only the first is served."""
    root = tmp_path / "collection"
    (root / "room").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    photo = sorted((sample_collection / "collection").glob("*.jpg"))[0].read_bytes()
    (root / "room" / "a.jpg").write_bytes(photo)
    (outside / "secret.jpg").write_bytes(photo)
    catalogue = [SimpleNamespace(path="room/a.jpg")]
    assert object_jpeg(catalogue, root, 0, 64)[:3] == b"\xff\xd8\xff"
    (root / "room" / "a.jpg").unlink()
    (root / "room" / "a.jpg").symlink_to(outside / "secret.jpg")  # swapped at request time
    with pytest.raises(ApiError) as e:
        object_jpeg(catalogue, root, 0, 64)
    assert e.value.status == 404
    (root / "room" / "a.jpg").unlink()
    (root / "room").rmdir()
    (outside / "a.jpg").write_bytes(photo)
    Path(root / "room").symlink_to(outside)  # a folder of the path is a link
    with pytest.raises(ApiError) as e:
        object_jpeg(catalogue, root, 0, 64)
    assert e.value.status == 404
    os.mkfifo(outside / "fifo.jpg")
    with pytest.raises(ApiError):
        object_jpeg([SimpleNamespace(path="../outside/fifo.jpg")], root, 0, 64)
