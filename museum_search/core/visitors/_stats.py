"""What visitors asked about (issue 34, item 2): the visitor log's counts per hour as figures, for
the Visitors view, ``museum-search stats`` and its ``--json`` and CSV."""

from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from museum_search.core.errors import MuseumSearchError

#: The confidence bands as counted (core's bands, and "none" for an answer without one).
BANDS = ("sure", "likely", "might", "none")
#: The columns of the counts (and of the CSV).
COLUMNS = ("hour", "instance", "verdict", "band", "language", "source", "n")


@dataclass(frozen=True)
class VisitorStats:
    """The counts' figures. ``rows``: the counts themselves, (hour, instance or "", verdict, band,
    language, source, n), by hour."""

    per_hour: list[tuple[str, int]]  # (hour "YYYY-MM-DDTHH:00", questions)
    per_day: list[tuple[str, int, int]]  # (day, questions, not recognised)
    top_objects: list[tuple[str, int]]  # (instance, times recognised), most first
    bands: dict[str, int]  # confidence band → questions
    languages: dict[str, int]  # language ("" unknown) → questions
    sources: dict[str, int]  # kiosk / phone / app → questions
    total: int
    not_recognised: int
    rows: list[tuple] = field(default_factory=list, repr=False)

    @property
    def share_not_recognised(self) -> float | None:
        return None if not self.total else self.not_recognised / self.total

    @property
    def share_not_recognised_per_day(self) -> list[tuple[str, float]]:
        """(day, the share of its questions not recognised), by day."""
        return [(d, m / n) for d, n, m in self.per_day if n]

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "not_recognised": self.not_recognised,
                "share_not_recognised": self.share_not_recognised,
                "per_hour": [{"hour": h, "questions": n} for h, n in self.per_hour],
                "per_day": [{"day": d, "questions": n, "not_recognised": m} for d, n, m in self.per_day],
                "top_objects": [{"instance": i, "recognised": n} for i, n in self.top_objects],
                "bands": self.bands, "languages": self.languages, "sources": self.sources}

    def to_csv(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """The counts as CSV (:data:`COLUMNS`), one row per hour and kind of answer. An existing
        file is refused unless ``overwrite`` (a save dialog's confirmation)."""
        path = Path(path)
        try:
            with open(path, "w" if overwrite else "x", encoding="utf-8", newline="") as f:
                w = csv.writer(f)
                w.writerow(COLUMNS)
                w.writerows(self.rows)
        except FileExistsError:
            raise MuseumSearchError(f"{path} exists already; it is left as it is (give a new file name)") from None
        except OSError as exc:
            raise MuseumSearchError(f"{path} cannot be written ({exc.strerror})") from None
        return path


def stats_of(rows: Iterable[tuple]) -> VisitorStats:
    """The figures of count rows (hour, instance, verdict, band, language, source, n)."""
    rows = [tuple(r) for r in rows]
    hours: Counter[str] = Counter()
    days: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    objects: Counter[str] = Counter()
    bands: Counter[str] = Counter({b: 0 for b in BANDS})
    languages: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    for hour, instance, verdict, band, language, source, n in rows:
        hours[hour] += n
        days[hour[:10]] += n
        if verdict != "recognised":
            missed[hour[:10]] += n
        elif instance:
            objects[instance] += n
        bands[band] += n
        languages[language] += n
        sources[source] += n
    total = sum(hours.values())
    return VisitorStats(sorted(hours.items()), [(d, days[d], missed[d]) for d in sorted(days)],
                        sorted(objects.items(), key=lambda kv: (-kv[1], kv[0])), dict(bands),
                        dict(languages), dict(sources), total, sum(missed.values()), rows)
