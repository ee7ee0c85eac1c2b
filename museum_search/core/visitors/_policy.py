"""What is counted and kept of visitors' questions: the staff's :class:`KeepPolicy` (issue 34).

Keeping is opt-in: by default nothing of a visitor's photo is kept, and only anonymous counts per
hour are (which can be turned off too). The words a visitor reads about it are decided here, once,
for the kiosk and the phone page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from museum_search.core.answer import confidence_band
from museum_search.core.errors import MuseumSearchError

#: keep nothing (the default) | the photos not recognised or not surely recognised | every photo
KEEP_MODES = ("none", "unsure", "all")

#: The one line a visitor reads where keeping is on, by language ({days}: the retention period).
NOTICES = {
    "unsure": {
        "en": "Photos we could not surely recognise are kept for {days} days to improve this guide; "
              "nothing else about you is kept.",
        "fr": "Les photos que nous n'avons pas reconnues avec certitude sont conservées {days} jours pour "
              "améliorer ce guide ; rien d'autre sur vous n'est conservé.",
        "de": "Fotos, die wir nicht sicher erkannt haben, werden {days} Tage aufbewahrt, um diesen Führer "
              "zu verbessern; sonst wird nichts über Sie gespeichert.",
    },
    "all": {
        "en": "Your photos are kept for {days} days to improve this guide; nothing else about you is kept.",
        "fr": "Vos photos sont conservées {days} jours pour améliorer ce guide ; rien d'autre sur vous "
              "n'est conservé.",
        "de": "Ihre Fotos werden {days} Tage aufbewahrt, um diesen Führer zu verbessern; sonst wird nichts "
              "über Sie gespeichert.",
    },
}


@dataclass(frozen=True)
class KeepPolicy:
    """What the kiosk and ``serve`` count and keep (the same setting for both)."""

    keep: str = "none"
    quota_mb: float = 500.0  # kept photos take at most this many MB in all
    per_day: int = 1000  # kept photos per day
    retention_days: int = 30  # kept photos not yet reviewed are deleted after this many days
    per_client_per_hour: int = 20  # serve: photos kept per client address per hour (in memory only)
    counting: bool = True  # anonymous counts per hour

    def __post_init__(self) -> None:
        if self.keep not in KEEP_MODES:
            raise MuseumSearchError(f"keep must be one of {', '.join(KEEP_MODES)}, not {self.keep!r}")
        _check_number("quota_mb", self.quota_mb, 1, 1_000_000, integer=False)
        _check_number("per_day", self.per_day, 1, 1_000_000)
        _check_number("retention_days", self.retention_days, 1, 3650)
        _check_number("per_client_per_hour", self.per_client_per_hour, 1, 100_000)
        if not isinstance(self.counting, bool):
            raise MuseumSearchError(f"counting must be true or false, not {self.counting!r}")

    @property
    def quota_bytes(self) -> int:
        return int(self.quota_mb * 1_000_000)

    def wants(self, answer: Any) -> bool:
        """Whether ``answer``'s photo is kept: "unsure" keeps what was not recognised or not surely
        recognised (its confidence band is not "sure"), "all" every photo, "none" none."""
        if self.keep == "all":
            return True
        if self.keep == "unsure":
            return not answer.in_collection or confidence_band(answer.confidence) != "sure"
        return False

    def notice(self, lang: str = "en") -> str | None:
        """The one plain line visitors read about what is kept, in ``lang`` (any tag: its primary
        subtag picks the words; English otherwise); None when nothing is kept."""
        if self.keep == "none":
            return None
        words = NOTICES[self.keep]
        return words.get(primary_language(lang), words["en"]).format(days=self.retention_days)

    def to_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "quota_mb": self.quota_mb, "per_day": self.per_day,
                "retention_days": self.retention_days, "per_client_per_hour": self.per_client_per_hour,
                "counting": self.counting}


def primary_language(tag: str | None) -> str:
    """A language tag's primary subtag, lower case: "fr" for "fr-CA" or "fr_FR"; "" for none."""
    return (tag or "").replace("_", "-").split("-")[0].lower()[:16]


def _check_number(name: str, value: Any, low: float, high: float, integer: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high and (not integer or float(value).is_integer())
    if not ok:
        kind = "a whole number" if integer else "a number"
        raise MuseumSearchError(f"{name} must be {kind} from {low:g} to {high:g}, not {value!r}")
