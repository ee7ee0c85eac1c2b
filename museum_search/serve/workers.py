"""A bounded pool of query workers: N threads, each with its own :class:`QueryPipeline`, and a
bounded number of requests admitted beyond them (the queue). What does not fit is refused at once
(the caller answers 503), so memory stays flat however many visitors ask at the same time."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence


class Busy(Exception):
    """Every worker is busy and the queue is full."""


class WorkerPool:
    """``len(pipelines)`` worker threads; at most ``workers + queue_size`` requests admitted.

    A request holds its admission from before its body is read until its answer is made, so the
    bytes held for photos are bounded by ``capacity × max_upload``. Each call runs on a worker
    thread with a pipeline of its own (pipelines keep per-call timings: one is never shared by two
    threads at once); the pipelines share the index and the network."""

    def __init__(self, pipelines: Sequence[Any], queue_size: int):
        if not pipelines:
            raise ValueError("a worker pool needs at least one pipeline")
        self.workers = len(pipelines)
        self.capacity = self.workers + max(0, int(queue_size))
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for p in pipelines:
            self._free.put(p)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="museum-search-query")
        self._lock = threading.Lock()
        self._admitted = 0
        self._busy = 0

    # ---- what /healthz reports ----------------------------------------------------------------
    @property
    def busy(self) -> int:
        """Workers answering a photo now."""
        return self._busy

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def queued(self) -> int:
        """Admitted requests not on a worker (receiving their photo, or waiting for a worker)."""
        with self._lock:
            return max(0, self._admitted - self._busy)

    # ---- admission ------------------------------------------------------------------------------
    def check_room(self) -> None:
        """Raises :class:`Busy` when every place is taken now (a photo is then not decoded for nothing;
        :meth:`admission` still decides)."""
        with self._lock:
            if self._admitted >= self.capacity:
                raise Busy()

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Hold one of the ``capacity`` places; raises :class:`Busy` when none is free."""
        with self._lock:
            if self._admitted >= self.capacity:
                raise Busy()
            self._admitted += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1

    # ---- work -----------------------------------------------------------------------------------
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(pipeline, *args)`` on a worker thread (never on the event loop)."""
        return await asyncio.wrap_future(self._executor.submit(self._call, fn, args))

    def _call(self, fn: Callable[..., Any], args: tuple) -> Any:
        pipeline = self._free.get()
        with self._lock:
            self._busy += 1
        try:
            return fn(pipeline, *args)
        finally:
            with self._lock:
                self._busy -= 1
            self._free.put(pipeline)

    def run_each(self, fn: Callable[[Any], Any]) -> None:
        """``fn(pipeline)`` for every pipeline, on the worker threads, and wait (the warm-up)."""
        pipes = [self._free.get() for _ in range(self.workers)]
        try:
            for f in [self._executor.submit(fn, p) for p in pipes]:
                f.result()
        finally:
            for p in pipes:
                self._free.put(p)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
