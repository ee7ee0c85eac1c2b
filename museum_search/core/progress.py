"""One progress record for every long job, and one way to drive a progress generator.

Long work in core (indexing, local features, calibration, evaluation, sweeps) is a generator that
yields :class:`Progress` records and returns its result; the CLI draws them with tqdm, the GUI runs
the generator on a worker thread (``gui/workers.py``). Closing the generator cancels the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Progress:
    """``done`` of ``total`` steps of ``stage``; the file (or query) just handled; new skips."""

    done: int
    total: int
    current: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), new since last
    elapsed: float = 0.0  # seconds since this stage started
    stage: str = "describing"

    @property
    def eta(self) -> float | None:
        """Seconds left in this stage, extrapolated from its rate so far (None before the first step)."""
        if self.done <= 0 or self.elapsed <= 0:
            return None
        return self.elapsed / self.done * max(0, self.total - self.done)

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


def drive(gen: Generator[T, None, R], on_progress: Callable[[T], object] | None = None) -> R:
    """Drive a progress generator to its end and return its result (closing it on any exception)."""
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            if on_progress is not None:
                on_progress(item)
    finally:
        gen.close()
