"""Shared application state (the open index) and typed settings remembered between runs."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, QSettings, Signal

from museum_search.core.index import Index

log = logging.getLogger(__name__)

MAX_RECENT = 8
#: Settings key of the kiosk's staff PIN, stored as a salted PBKDF2 hash (never the PIN itself).
PIN_SETTING = "demo/pin"
_PIN_ITERATIONS = 200_000
#: Settings key of the phone link the kiosk shows as a QR code in a corner (empty: no QR code).
QR_URL_SETTING = "demo/qr_url"
#: Settings group of what is counted and kept of visitors' questions (KeepPolicy's fields, and "folder").
VISITORS_SETTING = "visitors"
_SERVE_HINT = "the address that “museum-search serve --host 0.0.0.0” prints, e.g. http://192.168.1.20:8000/"


def phone_link_problem(url: str) -> str:
    """Why ``url`` cannot be the kiosk's phone link, in plain words for staff ("" when it can be,
    or is empty: no QR code). Phones open it: an http(s) address of this machine on the network."""
    text = (url or "").strip()
    if not text:
        return ""
    try:
        parts = urlsplit(text)
        host, _port = parts.hostname, parts.port  # .port raises ValueError on a bad port
    except ValueError:
        host, parts = None, None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not host or any(c.isspace() for c in text):
        return f"The phone link must be a web address starting with http:// or https://: {_SERVE_HINT}."
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host.lower() == "localhost" or (ip is not None and ip.is_loopback):
        return f"{host} is this computer only: a visitor's phone cannot open it. Use {_SERVE_HINT}."
    if ip is not None and ip.is_unspecified:
        return f"{host} is not an address a phone can open. Use {_SERVE_HINT}."
    return ""


def query_start_folder(settings: "Settings", index: Index | None) -> str:
    """Where *Open image…* starts: the folder of the last photo opened (if it is still there); on the
    bundled sample collection, its photos of visitors (``queries``); else the home folder."""
    from museum_search.core import paths

    last = str(settings.value("search/last_dir", "") or "")
    if last and Path(last).is_dir():
        return last
    sample = paths.sample_collection()
    if index is not None and index.root and (sample / "queries").is_dir():
        try:
            if Path(index.root).resolve() == (sample / "collection").resolve():
                return str(sample / "queries")
        except OSError:
            pass
    return str(Path.home())


def _typed(raw, default):
    """``raw`` as QSettings gives it back (an INI file gives text) in the type of ``default``."""
    if isinstance(default, bool):
        text = str(raw).strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise ValueError(f"{raw!r} is not true or false")
        return text in ("true", "1")
    return type(default)(raw)


def _pin_hash(pin: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", pin.encode("utf-8"), salt, iterations)


class Settings:
    """Typed access to QSettings (stored under the user's config folder by Qt)."""

    def __init__(self, qsettings: QSettings | None = None):
        self.q = qsettings or QSettings("museum-search", "museum-search")

    def _get(self, key: str, default, typ):
        value = self.q.value(key, default)
        try:
            return typ(value) if value is not None else default
        except (TypeError, ValueError):
            return default

    # recent indexes
    def recent_indexes(self) -> list[str]:
        value = self.q.value("recent_indexes", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or []) if v]

    def add_recent_index(self, path: str | Path) -> None:
        path = str(path)
        items = [p for p in self.recent_indexes() if p != path]
        self.q.setValue("recent_indexes", [path] + items[: MAX_RECENT - 1])

    @property
    def camera(self) -> int:
        return self._get("camera/index", 0, int)

    @camera.setter
    def camera(self, v: int) -> None:
        self.q.setValue("camera/index", int(v))

    @property
    def top_k(self) -> int:
        return self._get("search/k", 8, int)

    @top_k.setter
    def top_k(self, v: int) -> None:
        self.q.setValue("search/k", int(v))

    @property
    def engine(self) -> str:
        """The inference engine: "auto" (ONNX Runtime where installed), "onnx" or "torch"."""
        v = str(self._get("inference/engine", "auto", str))
        return v if v in ("auto", "onnx", "torch") else "auto"

    @engine.setter
    def engine(self, v: str) -> None:
        self.q.setValue("inference/engine", v)

    @property
    def matcher(self) -> str:
        """The verification matcher of new indexes: "sift", "xfeat" or "auto" (core.verification.MATCHERS);
        the Collection tab passes it to each build it starts."""
        from museum_search.core.verification import MATCHERS, default_matcher

        v = str(self._get("index/matcher", "", str))
        return v if v in MATCHERS else default_matcher()

    @matcher.setter
    def matcher(self, v: str) -> None:
        self.q.setValue("index/matcher", v)

    @property
    def whitening(self) -> bool:
        """Whether new indexes learn the verdict's whitening (``build_index(whitening=...)``); the
        Collection tab passes it to each build it starts."""
        return bool(self._get("index/whitening", False, lambda v: _typed(v, False)))

    @whitening.setter
    def whitening(self, v: bool) -> None:
        self.q.setValue("index/whitening", bool(v))

    # the kiosk's staff PIN (demo mode)
    @property
    def demo_pin_set(self) -> bool:
        """True when a staff PIN is set: leaving the kiosk asks for it."""
        return self._pin_record() is not None

    def set_demo_pin(self, pin: str | None) -> None:
        """Set the staff PIN (digits), or remove it with None or ""; only a salted hash is stored."""
        if not pin:
            self.q.remove(PIN_SETTING)
            return
        salt = secrets.token_bytes(16)
        digest = _pin_hash(pin, salt, _PIN_ITERATIONS)
        self.q.setValue(PIN_SETTING, f"pbkdf2_sha256${_PIN_ITERATIONS}${salt.hex()}${digest.hex()}")

    def check_demo_pin(self, pin: str) -> bool:
        """True when ``pin`` is the staff PIN (False when none is set)."""
        record = self._pin_record()
        if record is None:
            return False
        iterations, salt, digest = record
        return hmac.compare_digest(_pin_hash(str(pin), salt, iterations), digest)

    def _pin_record(self) -> tuple[int, bytes, bytes] | None:
        text = str(self.q.value(PIN_SETTING, "") or "")
        parts = text.split("$")
        if len(parts) != 4 or parts[0] != "pbkdf2_sha256":
            return None
        try:
            return int(parts[1]), bytes.fromhex(parts[2]), bytes.fromhex(parts[3])
        except ValueError:
            return None

    # the kiosk's phone link (demo mode): a QR code in a corner
    @property
    def demo_qr_url(self) -> str:
        """The web address the kiosk shows as a QR code ("" for none, or when the stored one is not
        a usable phone link: :func:`phone_link_problem`)."""
        value = self.q.value(QR_URL_SETTING, "")
        if isinstance(value, (list, tuple)):  # QSettings splits "a, b" into a list
            value = ", ".join(str(v) for v in value)
        text = str(value or "").strip()
        problem = phone_link_problem(text)
        if problem:
            log.warning("ignoring the kiosk's phone link %r: %s", text, problem)
            return ""
        return text

    @demo_qr_url.setter
    def demo_qr_url(self, url: str) -> None:
        text = (url or "").strip()
        if text:
            self.q.setValue(QR_URL_SETTING, text)
        else:
            self.q.remove(QR_URL_SETTING)

    # what the kiosk and the Visitors tab count and keep of visitors' questions (issue 34)
    @property
    def visitor_policy(self):
        """The stored :class:`museum_search.core.visitors.KeepPolicy` (keep nothing and count, unless
        changed in Settings); a stored value core refuses is left out (its default used) and logged."""
        from dataclasses import fields, replace

        from museum_search.core.errors import MuseumSearchError
        from museum_search.core.visitors import KeepPolicy

        policy = KeepPolicy()
        for f in fields(KeepPolicy):
            raw = self.q.value(f"{VISITORS_SETTING}/{f.name}")
            if raw is None:
                continue
            try:
                policy = replace(policy, **{f.name: _typed(raw, getattr(policy, f.name))})
            except (TypeError, ValueError, MuseumSearchError) as exc:
                log.warning("ignoring the stored visitors setting %s=%r: %s", f.name, raw, exc)
        return policy

    @visitor_policy.setter
    def visitor_policy(self, policy) -> None:
        from dataclasses import asdict

        for name, value in asdict(policy).items():
            self.q.setValue(f"{VISITORS_SETTING}/{name}", value)

    @property
    def visitors_folder(self) -> str:
        """The visitors' folder chosen in Settings ("": core's default, beside the index)."""
        return str(self._get(f"{VISITORS_SETTING}/folder", "", str) or "").strip()

    @visitors_folder.setter
    def visitors_folder(self, folder: str) -> None:
        self.q.setValue(f"{VISITORS_SETTING}/folder", str(folder or "").strip())

    def value(self, key: str, default=None):
        return self.q.value(key, default)

    def set_value(self, key: str, value) -> None:
        self.q.setValue(key, value)


class AppState(QObject):
    """The open index and the session's inference engine, shared by the tabs. ``index_changed`` fires
    with the new Index (or None).

    :attr:`engine` ("auto", "onnx" or "torch") is what the tabs and the kiosk put in the settings of each
    pipeline and job they start (``QuerySettings.engine``, the build and update jobs' ``engine``): the
    command line's ``--engine`` for this session, else the stored setting (:attr:`Settings.engine`,
    changed in the Settings dialog). The matcher of new builds is the stored one (:attr:`Settings.matcher`)."""

    index_changed = Signal(object)
    status = Signal(str)

    def __init__(self, settings: Settings | None = None, *, engine: str | None = None):
        super().__init__()
        self.settings = settings or Settings()
        self.index: Index | None = None
        self.engine: str = engine or self.settings.engine

    def set_index(self, index: Index | None) -> None:
        self.index = index
        if index is not None and index.path is not None:
            self.settings.add_recent_index(index.path)
        self.index_changed.emit(index)
        if index is not None:
            self.status.emit(f"Index: {index.summary()}")
