"""The decode memory budget, and damaged JPEG data: museum_search.core.images.

Decompression bombs are generated here, cheaply: a PNG of one colour is written by repeating one
deflate block (identical after a full flush), so a 20,000 x 20,000 16-bit RGBA PNG (3.2 GB
decoded) costs 3 MB of file and a few MB of memory to write. Peak memory is measured in a child
Python process (its peak resident size, ``ru_maxrss``; on Linux read as VmHWM, which can be reset
after the imports), so that nothing else in the test session counts.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from museum_search.core import images
from museum_search.core.errors import ImageError
from museum_search.core.images import (
    DECODE_BUDGET_BYTES,
    DECODE_BUDGET_ENV,
    DecodeBudget,
    decode_budget,
    decode_cost,
    decode_image,
    load_image,
    set_decode_budget,
)
from museum_search.core.inference._extract import extract
from museum_search.core.progress import drive as run

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "resources" / "sample" / "collection"

needs_rusage = pytest.mark.skipif(sys.platform == "win32", reason="ru_maxrss is POSIX only")


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_png_bomb(path: Path, width: int, height: int, bit_depth: int = 16, colour_type: int = 6,
                   value: int = 0x7F) -> Path:
    """A PNG of one colour (every sample byte ``value``: alpha 0x7F7F, half transparent).

    Rows are deflated a block at a time, and after a full flush an identical block compresses to
    identical bytes: the block is compressed twice and the second result repeated. Never holds
    more than one 4 MB block of pixels.
    """
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    row = b"\x00" + bytes([value]) * (width * channels * bit_depth // 8)  # filter 0 + samples
    per_block = max(1, (4 * MIB) // len(row))
    block = row * per_block
    n_blocks, rest = divmod(height, per_block)
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate: zlib header, Adler-32 by hand
    first = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    adler = 1
    for _ in range(n_blocks):
        adler = zlib.adler32(block, adler)
    tail = row * rest
    adler = zlib.adler32(tail, adler)
    parts = [b"\x78\x9c"] + ([first] + [again] * (n_blocks - 1) if n_blocks else [])
    parts += [comp.compress(tail) + comp.flush(), struct.pack(">I", adler)]
    stream = b"".join(parts)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr))
        for i in range(0, len(stream), MIB):
            f.write(png_chunk(b"IDAT", stream[i : i + MIB]))
        f.write(png_chunk(b"IEND", b""))
    return path


@pytest.fixture
def budget():
    """The process-wide budget, restored after the test."""
    yield decode_budget()
    set_decode_budget(DECODE_BUDGET_BYTES)


# Run in a child process; prints one JSON line. ``peak_mb()`` is the peak resident memory so far;
# ``start_mb()`` resets it to the current resident size where Linux allows (imports, torch's
# above all, peak above their resting size) and returns that size.
CHILD_PRELUDE = """
import json, resource, sys
import numpy as np
def _status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
def peak_mb():
    try:
        return _status_mb("VmHWM:")  # ru_maxrss, but resettable (ru_maxrss keeps exited threads')
    except OSError:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / (1 << 20) if sys.platform == "darwin" else kb / 1024  # bytes on macOS
def start_mb():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_mb("VmRSS:")
    except OSError:
        return peak_mb()
"""


def run_child(code: str, budget_mb: int | None = None, timeout: float = 600) -> dict:
    env = dict(os.environ)
    env.pop(DECODE_BUDGET_ENV, None)  # the default budget unless told
    if budget_mb is not None:
        env[DECODE_BUDGET_ENV] = str(budget_mb)
    r = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# The 20,000 x 20,000 16-bit RGBA PNG bomb: 3 MB of file, 3.2 GB decoded, 6.0 GB at peak
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def png_bomb(tmp_path_factory) -> Path:
    path = write_png_bomb(tmp_path_factory.mktemp("bomb") / "bomb.png", 20_000, 20_000)
    assert path.stat().st_size < 5_000_000
    return path


def test_bomb_cost_is_known_from_the_header(png_bomb):
    assert images.image_size(png_bomb) == (20_000, 20_000)
    decoded = 20_000 * 20_000 * 4 * 2
    # decoder output + OpenCV's copy of it, x 1.1 (the unbudgeted peak measured 6.0 GiB)
    assert 2 * decoded <= decode_cost(png_bomb) <= 2.5 * decoded
    assert decode_cost(png_bomb, max_side=512) == decode_cost(png_bomb)  # PNG: no reduced decoding


@needs_rusage
@pytest.mark.slow
def test_png_bomb_is_refused_by_load_image_in_bounded_memory(png_bomb):
    out = run_child(f"""
        from museum_search.core.errors import ImageError
        from museum_search.core.images import load_image, decode_image
        reasons = []
        for max_side in (None, 512):
            try:
                load_image({str(png_bomb)!r}, max_side=max_side)
            except ImageError as exc:
                reasons.append(exc.reason)
        try:
            decode_image(open({str(png_bomb)!r}, "rb").read(), "pasted.png")
        except ImageError as exc:
            reasons.append(exc.reason)
        print(json.dumps({{"reasons": reasons, "peak_mb": peak_mb()}}))
    """)
    assert len(out["reasons"]) == 3, out
    for reason in out["reasons"]:
        assert reason.startswith(
            "decoding needs 6.6 GB of memory (20000x20000 px, 4 channels, 16 bit), "
            "over the 1.0 GB decode budget; save a smaller 8-bit copy"
        ), reason
        assert DECODE_BUDGET_ENV in reason
    # Unbudgeted (the old code), decoding it peaked at 6.0 GB and succeeded.
    assert out["peak_mb"] < 1500, out


@needs_rusage
@pytest.mark.slow
def test_png_bomb_is_skipped_by_indexing_in_bounded_memory(png_bomb, tmp_path):
    folder = tmp_path / "collection"
    folder.mkdir()
    (folder / "bomb.png").write_bytes(png_bomb.read_bytes())
    photos = sorted(SAMPLE.glob("*.jpg"))[:2]
    for p in photos:
        (folder / p.name).write_bytes(p.read_bytes())
    out = run_child(f"""
        from museum_search.core.inference._engines import build_extractor
        from museum_search.core.images import load_image
        from museum_search.core.progress import drive as run
        from museum_search.core.jobs._indexing import build_index
        extractor = build_extractor()
        extractor.embed_images([load_image({str(folder / photos[0].name)!r}, max_side=extractor.max_side)])  # engine warmed up
        start = start_mb()
        report = run(build_index({str(folder)!r}, None, extractor=extractor, verification=False))
        print(json.dumps({{"indexed": sorted(it.path for it in report.index.items),
                          "skipped": report.skipped, "peak_mb": peak_mb(), "start_mb": start}}))
    """)
    assert out["indexed"] == sorted(p.name for p in photos)
    [(path, reason)] = out["skipped"]
    assert Path(path).name == "bomb.png"
    assert reason.startswith("decoding needs 6.6 GB of memory (20000x20000 px, 4 channels, 16 bit)")
    # Describing added < 0.5 GB to the peak of the process (the old code: +6 GB, and indexed it).
    # (verification=False: the local features and calibration that follow are not decoding.)
    assert out["peak_mb"] - out["start_mb"] < 500, out


# --------------------------------------------------------------------------------------------
# Parallel decodes share the budget
# --------------------------------------------------------------------------------------------

STUB_EXTRACTOR = """
class Meta:
    dim = 4

class Stub:
    meta = Meta()
    max_side = 512
    def preprocess(self, image):
        return image.reshape(-1, 3).mean(axis=0).astype(np.float32)
    def embed(self, batch):
        return np.full((len(batch), 4), 0.5, np.float32)
"""


@needs_rusage
@pytest.mark.slow
def test_parallel_bombs_wait_for_each_other_and_are_all_decoded(tmp_path):
    """Three opaque 16-bit RGBA PNGs of 4,500 x 4,500 px (0.34 GB at peak each) through
    ``extract`` with 3 workers and a 600 MB budget: each fits, two do not. By design they are
    decoded one after the other (each waits for the budget) and all get indexed; unbudgeted (the
    old code), 2 or 3 decode at once and the process peaks about 0.9 GB above its start."""
    paths = [write_png_bomb(tmp_path / f"b{i}.png", 4500, 4500, value=0xFF) for i in range(3)]
    each = decode_cost(paths[0], max_side=512)
    assert 300 * MIB < each < 600 * MIB < 2 * each
    out = run_child(STUB_EXTRACTOR + textwrap.dedent(f"""
        from museum_search.core import images
        from museum_search.core.inference._extract import extract
        from museum_search.core.progress import drive as run
        before = start_mb()
        res = run(extract({[str(p) for p in paths]!r}, Stub(), batch_size=1, workers=3))
        budget = images.decode_budget()
        print(json.dumps({{"ok": res.ok, "skipped": res.skipped, "peak_mb": peak_mb() - before,
                          "high_water": budget.high_water, "total": budget.total,
                          "in_use": budget.in_use}}))
    """), budget_mb=600)
    assert out["ok"] == [0, 1, 2] and out["skipped"] == []
    assert out["total"] == 600 * MIB
    assert out["high_water"] == each and out["in_use"] == 0  # one at a time
    assert out["peak_mb"] < 550, out  # measured: 0.34 GB


# --------------------------------------------------------------------------------------------
# Budget accounting in-process (small images)
# --------------------------------------------------------------------------------------------


def test_an_image_over_the_whole_budget_is_refused_at_once(tmp_path, budget, monkeypatch):
    path = write_png_bomb(tmp_path / "big.png", 2000, 1500)
    cost = decode_cost(path)
    set_decode_budget(cost - 1)
    calls = []
    with monkeypatch.context() as m:
        m.setattr(images, "_decode", lambda *a: calls.append(a))
        with pytest.raises(ImageError) as info:
            load_image(path)
        assert "(2000x1500 px, 4 channels, 16 bit), over the" in info.value.reason
        assert calls == [] and budget.in_use == 0  # nothing read or decoded, nothing held
        with pytest.raises(ImageError, match="decode budget"):
            decode_image(path.read_bytes())
    set_decode_budget(cost)
    assert load_image(path).shape == (1500, 2000, 3)
    assert budget.in_use == 0


def test_budget_counts_the_reduced_jpeg_size():
    from test_images import solid_jpeg

    data = solid_jpeg(20_000, 20_000, (30, 120, 220))
    header = images._read_header(io.BytesIO(data), "huge.jpg")
    full = images._decode_cost(header, None, len(data))
    eighth = images._decode_cost(header, 1024, len(data))
    assert (full.width, full.height, eighth.width, eighth.height) == (20_000, 20_000, 2500, 2500)
    assert full.peak > DECODE_BUDGET_BYTES  # refused at full size...
    assert eighth.peak < 50 * MIB  # ...but fine at 1/8 scale
    with pytest.raises(ImageError, match=r"decoding needs 2\.\d GB of memory \(20000x20000 px, 3 channels, 8 bit\)"):
        decode_image(data, "huge.jpg")
    assert decode_image(data, "huge.jpg", max_side=1024).shape == (1024, 1024, 3)


def test_progressive_jpeg_counts_its_full_size_coefficients():
    buf = io.BytesIO()
    Image.new("RGB", (1600, 1200), (10, 20, 30)).save(buf, "JPEG", progressive=True)
    header = images._read_header(io.BytesIO(buf.getvalue()), "p.jpg")
    assert header.multi_scan and header.sampling == ((2, 2), (1, 1), (1, 1))
    coefficients = 1600 * 1200 * 3 // 2 * 2  # 4:2:0 = 1.5 samples per pixel, 2 bytes each
    assert images._jpeg_coefficient_bytes(header) == coefficients
    assert images._decode_cost(header, 200, 0).peak > coefficients  # even at 1/8 scale
    baseline = images._read_header(io.BytesIO(buf.getvalue().replace(b"\xff\xc2", b"\xff\xc0", 1)), "b.jpg")
    assert not baseline.multi_scan


@pytest.mark.parametrize(
    ("fmt", "kw", "mode", "channels", "bits"),
    [("PNG", {}, "RGBA", 4, 8), ("PNG", {}, "L", 1, 8), ("PNG", {}, "P", 3, 8), ("PNG", {}, "I;16", 1, 16),
     ("JPEG", {}, "L", 1, 8), ("JPEG", {}, "CMYK", 4, 8), ("WEBP", {"lossless": True}, "RGBA", 4, 8),
     ("WEBP", {"quality": 80}, "RGB", 3, 8), ("BMP", {}, "RGB", 3, 8), ("TIFF", {}, "L", 1, 8),
     ("TIFF", {}, "RGB", 4, 8)],
)
def test_header_gives_decoded_channels_and_bits(fmt, kw, mode, channels, bits):
    buf = io.BytesIO()
    Image.new(mode, (40, 30)).save(buf, fmt, **kw)
    header = images._read_header(io.BytesIO(buf.getvalue()), "x")
    assert (header.channels, header.bits) == (channels, bits)


def test_parallel_decodes_never_hold_more_than_the_budget(tmp_path, budget):
    paths = [write_png_bomb(tmp_path / f"{i}.png", 1200, 900, value=0x30 + i) for i in range(8)]
    cost = decode_cost(paths[0])
    set_decode_budget(2 * cost + cost // 2)  # two at a time
    budget.reset_high_water()
    result = run(extract(paths, _Stub(), batch_size=2, workers=4))
    assert result.ok == list(range(8)) and result.skipped == []
    assert budget.high_water == 2 * cost and budget.in_use == 0


class _Stub:
    class meta:
        dim = 3

    max_side = 256

    def preprocess(self, image):
        return image.reshape(-1, 3).mean(axis=0).astype(np.float32)

    def embed(self, batch):
        return np.stack(batch)


# --------------------------------------------------------------------------------------------
# DecodeBudget itself
# --------------------------------------------------------------------------------------------


def _refuse(total):
    return ImageError("x", f"over {total}")


def test_budget_waits_serves_in_order_and_never_deadlocks():
    b = DecodeBudget(100)
    b.acquire(60, _refuse)
    order: list[str] = []

    def take(name: str, n: int, pause: float = 0.01) -> None:
        with b.hold(n, _refuse):
            order.append(name)
            time.sleep(pause)

    big = threading.Thread(target=take, args=("big", 90))
    big.start()
    time.sleep(0.05)
    small = threading.Thread(target=take, args=("small", 10))  # would fit now, but queues behind
    small.start()
    time.sleep(0.05)
    assert order == [] and b.in_use == 60
    b.release(60)
    big.join(5)
    small.join(5)
    assert order == ["big", "small"] and b.in_use == 0 and b.high_water == 100

    with pytest.raises(ImageError, match="over 100"):
        b.acquire(101, _refuse)
    with pytest.raises(ValueError):
        b.acquire(101)
    assert b.in_use == 0

    # Many threads with random sizes: everything fitting alone always completes.
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 101, 200)
    threads = [threading.Thread(target=take, args=(str(i), int(n), 0.001)) for i, n in enumerate(sizes)]
    order.clear()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(order) == 200 and b.in_use == 0 and b.high_water <= 100


def test_lowering_the_budget_refuses_waiting_requests_that_no_longer_fit():
    b = DecodeBudget(100)
    b.acquire(50, _refuse)
    errors: list[Exception] = []

    def take():
        try:
            b.acquire(80, _refuse)
        except ImageError as exc:
            errors.append(exc)

    t = threading.Thread(target=take)
    t.start()
    time.sleep(0.05)
    b.set_total(60)
    t.join(5)
    assert len(errors) == 1 and "over 60" in errors[0].reason
    b.set_total(None)  # unlimited
    b.acquire(10**12, _refuse)
    assert b.total is None and b.in_use == 50 + 10**12


@pytest.mark.parametrize(("value", "expected"), [("", 1 << 30), ("256", 256 * MIB), ("0.5", MIB // 2),
                                                  ("0", None), ("lots", 1 << 30), ("-3", 1 << 30)])
def test_budget_from_environment(value, expected):
    out = run_child("""
        from museum_search.core import images
        print(json.dumps({"constant": images.DECODE_BUDGET_BYTES, "total": images.decode_budget().total}))
    """, budget_mb=value)
    assert out["total"] == expected
    assert out["constant"] == (expected or 0)


# --------------------------------------------------------------------------------------------
# Damaged JPEG data
# --------------------------------------------------------------------------------------------


def damage_scan(data: bytes, n: int = 20) -> bytes:
    """XOR 0x55 on ``n`` bytes spread over the middle half of the JPEG's entropy-coded data,
    never creating or touching a 0xFF byte (no marker appears: the structure stays valid)."""
    header = images._read_header(io.BytesIO(data), "x.jpg")
    start, end = header.scan_offset, data.rindex(b"\xff\xd9")
    out = bytearray(data)
    pos, step, done = start + (end - start) // 4, (end - start) // (2 * n), 0
    while done < n:
        if out[pos] != 0xFF and out[pos - 1] != 0xFF and out[pos] ^ 0x55 != 0xFF:
            out[pos] ^= 0x55
            done += 1
            pos += step
        else:
            pos += 1
    return bytes(out)


@pytest.fixture(scope="module")
def painting(shared_data) -> Path:
    return sorted((shared_data / "paintings").rglob("*.jpg"))[0]


@pytest.mark.data
def test_damaged_jpeg_data_is_refused_and_the_intact_photo_decodes(painting, tmp_path):
    data = painting.read_bytes()
    intact = load_image(painting)
    assert intact.shape[2] == 3 and intact.std() > 10
    bad = tmp_path / "damaged.jpg"
    bad.write_bytes(damage_scan(data))
    assert images._check_jpeg_data(bad.read_bytes(), images._read_header(io.BytesIO(data), "x")) is None
    for max_side in (None, 256):
        with pytest.raises(ImageError) as info:
            load_image(bad, max_side=max_side)
        assert info.value.reason.startswith("JPEG data is damaged (corrupt JPEG data: "), info.value.reason
        assert info.value.reason.endswith("); copy the file again from the original")
    with pytest.raises(ImageError, match="JPEG data is damaged"):
        decode_image(bad.read_bytes(), "pasted.jpg")
    # ... and skipped with the reason when indexing, the intact copy described
    good = tmp_path / "intact.jpg"
    good.write_bytes(data)
    result = run(extract([good, bad], _Stub(), batch_size=2))
    assert result.ok == [0]
    [(path, reason)] = result.skipped
    assert path == str(bad) and reason.startswith("JPEG data is damaged")
    np.testing.assert_array_equal(load_image(good), intact)


@pytest.mark.data
def test_a_few_padding_bytes_before_the_end_are_harmless(painting):
    data = painting.read_bytes()
    end = data.rindex(b"\xff\xd9")

    def padded(n: int) -> bytes:
        return data[:end] + b"\x5a" * n + data[end:]

    def warning(d: bytes) -> str | None:
        try:
            simplejpeg.decode_jpeg(d, strict=True)
        except ValueError as exc:
            return str(exc)
        return None

    # libjpeg's bit buffer swallows the first few bytes; then it warns of each extra one
    n = next(n for n in range(1, 16) if warning(padded(n)))
    assert warning(padded(n + 3)) == "Corrupt JPEG data: 4 extraneous bytes before marker 0xd9"
    np.testing.assert_array_equal(decode_image(padded(n + 3)), decode_image(data))
    with pytest.raises(ImageError, match=r"JPEG data is damaged \(corrupt JPEG data: 5 extraneous bytes"):
        decode_image(padded(n + 4))


# --------------------------------------------------------------------------------------------
# Running out of memory anyway is a reason, not a crash
# --------------------------------------------------------------------------------------------


def test_memory_errors_become_reasons(tmp_path, monkeypatch):
    path = tmp_path / "q.png"
    Image.new("RGB", (64, 48), (1, 2, 3)).save(path)

    def no_memory(*args, **kwargs):
        raise MemoryError

    with monkeypatch.context() as m:
        m.setattr(images, "_shrink", no_memory)
        with pytest.raises(ImageError, match=r"^.*: not enough memory to decode this image \(about 1 MB needed\)"):
            load_image(path)
    assert decode_budget().in_use == 0

    class Hungry(_Stub):
        def preprocess(self, image):
            raise MemoryError

    result = run(extract([path], Hungry()))
    assert result.ok == [] and result.skipped == [
        (str(path), "not enough memory to prepare this image; close other programs, or save a "
                    "smaller copy and use that")]
