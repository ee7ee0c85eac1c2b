"""museum_search.core.images: decoding every supported kind of photo, refusing every bad one.

All fixtures are generated here, in tmp_path. Huge JPEGs are written directly as a JPEG bit
stream (a solid colour needs 3 bits per 8x8 block), so a 20,000 x 20,000 px photo costs 7 MB of
bytes and never a full-size bitmap.
"""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from museum_search.core import images
from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.images import (
    SUPPORTED_EXTENSIONS,
    decode_image,
    image_size,
    is_image_file,
    load_image,
)

RED, GREEN, BLUE, YELLOW, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 255, 255)


# --------------------------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------------------------


def quadrants(w: int = 64, h: int = 48) -> np.ndarray:
    """RGB image: red top-left, green top-right, blue bottom-left, yellow bottom-right."""
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = RED
    a[: h // 2, w // 2 :] = GREEN
    a[h // 2 :, : w // 2] = BLUE
    a[h // 2 :, w // 2 :] = YELLOW
    return a


def quadrant_colours(img: np.ndarray) -> list[tuple[int, ...]]:
    """Colours at the centres of the four quadrants: TL, TR, BL, BR."""
    h, w = img.shape[:2]
    return [tuple(int(v) for v in img[y, x]) for y in (h // 4, 3 * h // 4) for x in (w // 4, 3 * w // 4)]


def assert_colours(got, expected, tol: int = 0) -> None:
    got_a, exp_a = np.asarray(got, int), np.asarray(expected, int)
    assert np.abs(got_a - exp_a).max() <= tol, f"{got} != {expected} (tolerance {tol})"


def assert_rgb8(img: np.ndarray, shape: tuple[int, int]) -> None:
    assert img.dtype == np.uint8
    assert img.shape == (*shape, 3)
    assert img.flags["C_CONTIGUOUS"]


def save(tmp_path, name: str, im: Image.Image, fmt: str, **kw):
    path = tmp_path / name
    im.save(path, fmt, **kw)
    return path


def exif(orientation: int) -> Image.Exif:
    e = Image.Exif()
    e[0x0112] = orientation
    return e


def jpeg_bytes(a: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=95, **kw)
    return buf.getvalue()


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def solid_jpeg(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid baseline 4:4:4 JPEG of one colour, built without ever holding the bitmap.

    Quantisation is all ones; the DC table is the standard luminance one (JPEG Annex K.3) and
    the AC table has the single symbol EOB with code "0". Only the first block of each component
    carries a DC difference; every later block is "00" (DC diff 0) + "0" (EOB): zero bits.
    """
    r, g, b = rgb
    ycc = (
        0.299 * r + 0.587 * g + 0.114 * b,
        128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
        128 + 0.5 * r - 0.418688 * g - 0.081312 * b,
    )
    dc_bits = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    codes, code, symbol = {}, 0, 0
    for length, count in enumerate(dc_bits, 1):
        for _ in range(count):
            codes[symbol] = format(code, f"0{length}b")
            code, symbol = code + 1, symbol + 1
        code <<= 1
    bits = ""
    for v in ycc:
        dc = round(8 * (v - 128))
        cat = abs(dc).bit_length()
        extra = format(dc if dc > 0 else dc + (1 << cat) - 1, f"0{cat}b") if cat else ""
        bits += codes[cat] + extra + "0"
    n_blocks = -(-width // 8) * -(-height // 8) * 3
    total_bits = len(bits) + (n_blocks - 3) * 3
    head_bits = bits + "0" * (-len(bits) % 8)
    head = int(head_bits, 2).to_bytes(len(head_bits) // 8, "big")
    n_bytes = -(-total_bits // 8)
    body = bytearray(head + bytes(n_bytes - len(head)))
    body[-1] |= (1 << (n_bytes * 8 - total_bits)) - 1  # pad the last byte with 1 bits
    return (
        b"\xff\xd8"
        + _segment(0xDB, b"\x00" + b"\x01" * 64)
        + _segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00")
        + _segment(0xC4, b"\x00" + bytes(dc_bits) + bytes(range(12)))
        + _segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
        + _segment(0xDA, b"\x03\x01\x00\x02\x00\x03\x00\x00\x3f\x00")
        + bytes(body).replace(b"\xff", b"\xff\x00")
        + b"\xff\xd9"
    )


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        out.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return out


@pytest.fixture
def decode_calls(monkeypatch):
    """Records the shape (None: failure) of every image decoded, by OpenCV or by simplejpeg."""
    calls: list[tuple[int, ...] | None] = []

    def spy(real):
        def decode(*args, **kwargs):
            try:
                out = real(*args, **kwargs)
            except Exception:
                calls.append(None)
                raise
            calls.append(None if out is None else out.shape)
            return out

        return decode

    monkeypatch.setattr(cv2, "imdecode", spy(cv2.imdecode))
    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy(simplejpeg.decode_jpeg))
    return calls


def refused(path_or_bytes, **kw) -> ImageError:
    """The ImageError raised for a bad input (path: load_image; bytes: decode_image)."""
    with pytest.raises(ImageError) as info:
        if isinstance(path_or_bytes, bytes):
            decode_image(path_or_bytes, name="pasted.jpg", **kw)
        else:
            load_image(path_or_bytes, **kw)
    err = info.value
    assert isinstance(err, MuseumSearchError)
    assert str(err) == f"{err.path}: {err.reason}"
    return err


# --------------------------------------------------------------------------------------------
# Extensions
# --------------------------------------------------------------------------------------------


def test_supported_extensions_and_is_image_file(tmp_path):
    assert SUPPORTED_EXTENSIONS == {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp"}
    assert all(e == e.lower() and e.startswith(".") for e in SUPPORTED_EXTENSIONS)
    for name in ["a.jpg", "B.JPEG", "c.Png", "d.TIF", "e.tiff", "f.webp", "g.BMP", "Musée/画.JPG"]:
        assert is_image_file(name), name
    assert is_image_file(tmp_path / "x.Jpg")
    for name in ["a.gif", "b.jpg.zip", "notes.txt", "jpg", "a.heic", "._IMG_0001.JPG", "dir/._x.png"]:
        assert not is_image_file(name), name


# --------------------------------------------------------------------------------------------
# Good inputs
# --------------------------------------------------------------------------------------------

FORMATS = [
    ("q.jpg", "JPEG", {"quality": 95}, 12),
    ("q.png", "PNG", {}, 0),
    ("q.tif", "TIFF", {}, 0),
    ("q_lzw.tiff", "TIFF", {"compression": "tiff_lzw"}, 0),
    ("q.webp", "WEBP", {"quality": 95}, 16),
    ("q_lossless.webp", "WEBP", {"lossless": True}, 0),
    ("q.bmp", "BMP", {}, 0),
]


@pytest.mark.parametrize(("name", "fmt", "kw", "tol"), FORMATS, ids=[f[0] for f in FORMATS])
def test_each_format_decodes_to_rgb(tmp_path, name, fmt, kw, tol):
    path = save(tmp_path, name, Image.fromarray(quadrants()), fmt, **kw)
    img = load_image(path)
    assert_rgb8(img, (48, 64))
    assert_colours(quadrant_colours(img), [RED, GREEN, BLUE, YELLOW], tol)
    assert image_size(path) == (64, 48)
    np.testing.assert_array_equal(decode_image(path.read_bytes(), name=name), img)


def test_content_decides_not_extension(tmp_path):
    path = save(tmp_path, "actually_a_png.jpg", Image.fromarray(quadrants()), "PNG")
    assert_colours(quadrant_colours(load_image(path)), [RED, GREEN, BLUE, YELLOW])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "TIFF"])
def test_greyscale_is_expanded_to_rgb(tmp_path, fmt):
    grey = np.tile(np.array([0, 100, 200, 255], np.uint8).repeat(16), (32, 1))  # 4 bands, 64 wide
    path = save(tmp_path, f"g.{fmt.lower()}", Image.fromarray(grey, "L"), fmt)
    img = load_image(path)
    assert_rgb8(img, (32, 64))
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
    assert_colours(img[16, [8, 24, 40, 56], 0], [0, 100, 200, 255], tol=3 if fmt == "JPEG" else 0)


def rgba_fixture() -> np.ndarray:
    """Opaque red | half-transparent blue | fully transparent green, 3 bands of 10 px."""
    a = np.zeros((8, 30, 4), np.uint8)
    a[:, :10] = (255, 0, 0, 255)
    a[:, 10:20] = (0, 0, 255, 128)
    a[:, 20:] = (0, 255, 0, 0)
    return a


@pytest.mark.parametrize(("fmt", "kw"), [("PNG", {}), ("WEBP", {"lossless": True}), ("TIFF", {})])
def test_alpha_is_composited_onto_white(tmp_path, fmt, kw):
    path = save(tmp_path, f"a.{fmt.lower()}", Image.fromarray(rgba_fixture(), "RGBA"), fmt, **kw)
    img = load_image(path)
    assert_rgb8(img, (8, 30))
    # blue at alpha 128/255 over white: 255 * (1 - 128/255) = 127
    assert_colours(img[4, [5, 15, 25]], [RED, (127, 127, 255), WHITE], tol=1)


def test_grey_alpha_and_palette_transparency(tmp_path):
    la = np.zeros((4, 20, 2), np.uint8)
    la[:, :10] = (40, 255)
    la[:, 10:] = (0, 0)
    img = load_image(save(tmp_path, "la.png", Image.fromarray(la, "LA"), "PNG"))
    assert_colours(img[2, [5, 15]], [(40, 40, 40), WHITE])

    pal = Image.new("P", (20, 4), 0)
    pal.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    pal.paste(1, (10, 0, 20, 4))
    img = load_image(save(tmp_path, "p.png", pal, "PNG", transparency=0))
    assert_colours(img[2, [5, 15]], [WHITE, BLUE])


def test_entirely_transparent_alpha_is_treated_as_unused(tmp_path):
    bgra = np.zeros((6, 6, 4), np.uint8)
    bgra[..., :3] = (30, 20, 10)  # BGR
    path = tmp_path / "zero_alpha.png"
    path.write_bytes(cv2.imencode(".png", bgra)[1].tobytes())
    assert_colours(load_image(path)[3, 3], (10, 20, 30))


@pytest.mark.parametrize("ext", [".png", ".tif"])
def test_16_bit_is_scaled_to_8_bit(tmp_path, ext):
    bgr16 = np.zeros((4, 12, 3), np.uint16)
    bgr16[:, :4] = (0, 0, 65535)  # red
    bgr16[:, 4:8] = (128 * 257, 128 * 257, 128 * 257)  # mid grey
    bgr16[:, 8:] = (65535, 257, 0)  # blue with a trace of green
    path = tmp_path / f"deep{ext}"
    path.write_bytes(cv2.imencode(ext, bgr16)[1].tobytes())
    img = load_image(path)
    assert_rgb8(img, (4, 12))
    assert_colours(img[2, [1, 5, 9]], [RED, (128, 128, 128), (0, 1, 255)])


def test_16_bit_grey_and_16_bit_alpha(tmp_path):
    grey = np.full((4, 4), 200 * 257, np.uint16)
    path = tmp_path / "grey16.png"
    path.write_bytes(cv2.imencode(".png", grey)[1].tobytes())
    assert_colours(load_image(path)[0, 0], (200, 200, 200))

    bgra = np.zeros((4, 4, 4), np.uint16)
    bgra[...] = (0, 0, 65535, 32768)  # red at ~50 % alpha
    for ext in (".png", ".tif"):
        path = tmp_path / f"rgba16{ext}"
        path.write_bytes(cv2.imencode(ext, bgra)[1].tobytes())
        assert_colours(load_image(path)[0, 0], (255, 127, 127), tol=1)


def test_cmyk_jpeg_and_tiff_become_correct_rgb(tmp_path):
    cmyk = Image.new("CMYK", (64, 48), (0, 0, 0, 0))  # white
    cmyk.paste((0, 255, 255, 0), (0, 0, 32, 24))  # red
    cmyk.paste((255, 0, 255, 0), (32, 0, 64, 24))  # green
    cmyk.paste((255, 255, 0, 0), (0, 24, 32, 48))  # blue
    cmyk.paste((0, 0, 0, 191), (32, 24, 64, 48))  # 75 % black -> grey 64
    expected = [RED, GREEN, BLUE, (64, 64, 64)]
    jpg = save(tmp_path, "cmyk.jpg", cmyk, "JPEG", quality=95)
    assert b"Adobe" in jpg.read_bytes()  # Adobe-style (inverted) CMYK, as Photoshop writes it
    img = load_image(jpg)
    assert_rgb8(img, (48, 64))
    assert_colours(quadrant_colours(img), expected, tol=6)
    assert_colours(quadrant_colours(load_image(jpg, max_side=32)), expected, tol=8)

    tif = save(tmp_path, "cmyk.tif", cmyk, "TIFF")
    assert_colours(quadrant_colours(load_image(tif)), expected, tol=1)


# -- EXIF orientation ------------------------------------------------------------------------


def corner_image() -> Image.Image:
    """60 x 40 blue with a red 10 x 10 top-left corner."""
    a = np.zeros((40, 60, 3), np.uint8)
    a[...] = BLUE
    a[:10, :10] = RED
    return Image.fromarray(a)


def red_corner(img: np.ndarray) -> str:
    h, w = img.shape[:2]
    corners = {"TL": img[2, 2], "TR": img[2, w - 3], "BL": img[h - 3, 2], "BR": img[h - 3, w - 3]}
    red = [k for k, v in corners.items() if v[0] > 200 and v[2] < 60]
    assert len(red) == 1, corners
    return red[0]


@pytest.mark.parametrize(
    ("orientation", "shape", "corner"),
    [(1, (40, 60), "TL"), (3, (40, 60), "BR"), (6, (60, 40), "TR"), (8, (60, 40), "BL")],
)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_is_applied(tmp_path, fmt, orientation, shape, corner):
    path = save(tmp_path, f"o{orientation}.{fmt.lower()}", corner_image(), fmt, exif=exif(orientation))
    img = load_image(path)
    assert_rgb8(img, shape)
    assert red_corner(img) == corner
    assert image_size(path) == (shape[1], shape[0])
    small = load_image(path, max_side=30)
    assert max(small.shape[:2]) == 30 and red_corner(small) == corner


@pytest.mark.parametrize(("orientation", "shape", "corner"), [(3, (40, 60), "BR"), (6, (60, 40), "TR")])
def test_tiff_orientation_tag_is_applied_once(tmp_path, orientation, shape, corner):
    path = save(tmp_path, "o.tif", corner_image(), "TIFF", tiffinfo={0x0112: orientation})
    img = load_image(path)
    assert img.shape[:2] == shape and red_corner(img) == corner
    assert image_size(path) == (shape[1], shape[0])


@pytest.mark.parametrize("orientation", range(1, 9))
def test_all_eight_orientations_match_pillow(tmp_path, orientation):
    rng = np.random.default_rng(orientation)
    im = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    path = save(tmp_path, "r.png", im, "PNG", exif=exif(orientation))
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    np.testing.assert_array_equal(load_image(path), expected)


def test_png_exif_after_image_data_is_honoured(tmp_path):
    buf = io.BytesIO()
    corner_image().save(buf, "PNG", exif=exif(6))
    chunks = png_chunks(buf.getvalue())
    exif_chunk = next(c for c in chunks if c[0] == b"eXIf")
    chunks.remove(exif_chunk)
    chunks.insert(len(chunks) - 1, exif_chunk)  # just before IEND
    assert [k for k, _ in chunks][-2:] == [b"eXIf", b"IEND"]
    path = tmp_path / "late_exif.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"".join(png_chunk(k, d) for k, d in chunks))
    assert image_size(path) == (40, 60)
    assert red_corner(load_image(path)) == "TR"


def test_unicode_path(tmp_path):
    folder = tmp_path / "Musée_Ωmega"
    folder.mkdir()
    path = save(folder, "画.jpg", corner_image(), "JPEG", quality=95, exif=exif(6))
    assert is_image_file(path)
    assert image_size(path) == (40, 60)
    img = load_image(path)
    assert img.shape == (60, 40, 3) and red_corner(img) == "TR"


# -- Size reduction --------------------------------------------------------------------------


def test_max_side_uses_reduced_jpeg_decoding(tmp_path, decode_calls):
    path = tmp_path / "big.jpg"
    path.write_bytes(solid_jpeg(6000, 4000, (200, 60, 30)))
    assert image_size(path) == (6000, 4000)
    assert decode_calls == []  # the size comes from the header alone
    img = load_image(path, max_side=1024)
    assert_rgb8(img, (683, 1024))
    assert_colours(img[[0, -1, 300], [0, -1, 500]], [(200, 60, 30)] * 3, tol=2)
    # 6000/4 = 1500 >= 1024 > 6000/8: decoded at 1/4 scale, then resized with INTER_AREA
    assert decode_calls == [(1000, 1500, 3)]


def test_20000_px_jpeg_never_decoded_at_full_size(tmp_path, decode_calls):
    path = tmp_path / "huge.jpg"
    path.write_bytes(solid_jpeg(20_000, 20_000, (30, 120, 220)))
    assert path.stat().st_size < 10_000_000
    assert image_size(path) == (20_000, 20_000)
    img = load_image(path, max_side=1024)
    assert_rgb8(img, (1024, 1024))
    assert_colours(img[[0, 511, 1023], [0, 700, 1023]], [(30, 120, 220)] * 3, tol=2)
    assert decode_calls == [(2500, 2500, 3)]  # 1/8 scale: 2.5 % of the full-size bitmap


@pytest.mark.parametrize(
    ("long_side", "max_side", "k"),
    [(6000, 1024, 4), (6000, 750, 8), (6000, 751, 4), (6000, 1600, 2), (6000, 3000, 2),
     (6000, 3001, 1), (6000, None, 1), (1000, 2000, 1), (1001, 126, 8), (1001, 127, 4)],
)
def test_smallest_reduction_that_stays_at_least_max_side(long_side, max_side, k):
    assert images._jpeg_reduction(long_side, max_side) == k


def test_reduced_sizes_round_up_like_libjpeg(decode_calls):
    img = decode_image(solid_jpeg(1001, 43, GREEN), max_side=126)  # ceil(1001 / 8) = 126
    assert decode_calls == [(6, 126, 3)]  # ceil(43 / 8) = 6
    assert_rgb8(img, (6, 126))
    assert_colours(img[3, 60], GREEN, tol=2)


def test_max_side_content_survives_reduction(tmp_path, decode_calls):
    data = jpeg_bytes(quadrants(1600, 1200))
    img = decode_image(data, max_side=300)  # 1600/4 = 400 >= 300 > 1600/8
    assert_rgb8(img, (225, 300))
    assert_colours(quadrant_colours(img), [RED, GREEN, BLUE, YELLOW], tol=12)
    assert decode_calls == [(300, 400, 3)]  # decoded at 1/4 scale


def test_max_side_on_png_and_never_upscale(tmp_path):
    path = save(tmp_path, "q.png", Image.fromarray(quadrants(640, 480)), "PNG")
    img = load_image(path, max_side=64)
    assert_rgb8(img, (48, 64))
    assert_colours(quadrant_colours(img), [RED, GREEN, BLUE, YELLOW])
    assert load_image(path, max_side=5000).shape == (480, 640, 3)
    assert load_image(path, max_side=640).shape == (480, 640, 3)


def test_bad_max_side_is_a_programming_error(tmp_path):
    path = save(tmp_path, "q.png", Image.fromarray(quadrants()), "PNG")
    with pytest.raises(ValueError):
        load_image(path, max_side=0)
    with pytest.raises(TypeError):
        load_image(path, max_side=2.5)


# --------------------------------------------------------------------------------------------
# Bad inputs: one fixture per kind, each refused with a reason
# --------------------------------------------------------------------------------------------


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    err = refused(path)
    assert err.path == str(path)
    assert err.reason.startswith("file is empty (0 bytes)")
    with pytest.raises(ImageError, match="file is empty"):
        image_size(path)
    assert refused(b"").reason.startswith("file is empty (0 bytes)")


def test_text_file_with_jpg_extension(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("Inventory 1987.4.12 — oil on canvas, 60 × 80 cm\n", encoding="utf-8")
    assert refused(path).reason == "not an image: the file contains text"


def test_web_page_saved_as_jpg(tmp_path):
    path = tmp_path / "download.jpg"
    path.write_text("<!DOCTYPE html>\n<html><body>404 Not Found</body></html>")
    assert "web page" in refused(path).reason


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.png"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert refused(path).reason == "not an image (unrecognised format)"
    assert refused(path.read_bytes()).path == "pasted.jpg"


def test_unsupported_format_says_what_it_is(tmp_path):
    path = save(tmp_path, "anim.jpg", Image.new("RGB", (4, 4)), "GIF")
    assert refused(path).reason.startswith("unsupported image format (GIF)")


def test_directory_named_like_an_image(tmp_path):
    path = tmp_path / "x.jpg"
    path.mkdir()
    assert "folder" in refused(path).reason
    with pytest.raises(ImageError, match="folder"):
        image_size(path)


def test_missing_file(tmp_path):
    assert refused(tmp_path / "gone.jpg").reason.startswith("file not found")


def test_truncated_jpeg(tmp_path):
    data = jpeg_bytes(quadrants(320, 240))
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) * 6 // 10])
    reason = refused(path).reason
    assert reason.startswith("truncated or corrupt JPEG data") and "end of the image data is missing" in reason
    assert image_size(path) == (320, 240)  # the header is intact


def test_jpeg_with_zero_filled_tail(tmp_path):
    """A copy that failed part-way on some file systems: right size, zeros at the end."""
    data = jpeg_bytes(quadrants(320, 240))
    path = tmp_path / "zeros.jpg"
    path.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    assert "end of the image data is missing" in refused(path).reason


def test_jpeg_cut_inside_header(tmp_path):
    data = jpeg_bytes(quadrants(), exif=exif(1))
    assert "ends inside its header" in refused(data[:30]).reason


def test_jpeg_with_foreign_bytes_in_the_middle(tmp_path):
    """Another file's bytes spliced into the image data (cross-linked or badly recovered file)."""
    data = jpeg_bytes(quadrants(320, 240))
    other = jpeg_bytes(quadrants(64, 48)[::-1])
    mid = len(data) // 2
    path = tmp_path / "spliced.jpg"
    path.write_bytes(data[:mid] + other[:600] + data[mid + 600 :])
    reason = refused(path).reason
    assert reason.startswith("truncated or corrupt JPEG data") and "unexpected marker 0xD8" in reason


def test_png_with_corrupt_bytes_in_the_middle(tmp_path):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    mid = len(data) // 2
    data[mid : mid + 64] = np.random.default_rng(3).integers(0, 256, 64, dtype=np.uint8).tobytes()
    path = tmp_path / "damaged.png"
    path.write_bytes(bytes(data))
    assert refused(path).reason.startswith("truncated or corrupt PNG data")
    assert image_size(path) == (64, 64)


@pytest.mark.parametrize(("fmt", "kw"), [("PNG", {}), ("WEBP", {}), ("TIFF", {}), ("BMP", {})])
def test_truncated_files_of_every_format(tmp_path, fmt, kw):
    buf = io.BytesIO()
    Image.fromarray(quadrants(200, 150)).save(buf, fmt, **kw)
    data = buf.getvalue()
    reason = refused(data[: len(data) * 6 // 10]).reason
    name = {"WEBP": "WebP"}.get(fmt, fmt)
    assert reason.startswith(f"truncated or corrupt {name} data"), reason


def test_huge_dimension_claim_is_refused_before_decoding(tmp_path, decode_calls):
    ihdr = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" + bytes(90_000))  # one row; the rest is missing anyway
    path = tmp_path / "bomb.png"
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
    )
    assert image_size(path) == (30_000, 30_000)
    reason = refused(path, max_side=1024).reason
    assert reason.startswith("image too large: 30000x30000 px exceeds the 400-megapixel limit")
    assert decode_calls == []


def test_jpeg_header_claiming_too_many_pixels(tmp_path, decode_calls):
    data = solid_jpeg(8, 8, WHITE).replace(struct.pack(">HH", 8, 8), struct.pack(">HH", 40_000, 40_000), 1)
    assert "exceeds the 400-megapixel limit" in refused(data).reason
    assert decode_calls == []
