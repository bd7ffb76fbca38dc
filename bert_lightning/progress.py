"""Progress of the long steps before training (training a tokenizer, reading and tokenizing a
corpus): off a terminal, a log line every `SECONDS` seconds with the count, the rate and, where
the total is known, the time left, so that a log file tells work from a hang. `SECONDS` is a
run's own cadence off a terminal, `callbacks.progress_bar.seconds` as shipped
(conf/callbacks/_progress.yaml): one cadence for every line of a run. On a terminal the
steps show bars (`datasets`' own, and `progress`'s tqdm)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

from bert_lightning.shipped import group_defaults

log = logging.getLogger(__name__)

SECONDS = float(group_defaults("callbacks", "_progress")["progress_bar"]["seconds"])
T = TypeVar("T")


def eta_text(seconds: float) -> str:
    """`1h05m` or `4m09s`: a progress line's time left."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def on_terminal() -> bool:
    return sys.stdout.isatty()


class Ticks:
    """Counts units of work done and, off a terminal, logs `what: N[ of TOTAL] UNIT, R/s[, eta]`
    once `seconds` have passed since the start or the last line. Picklable, so a `datasets.map`
    function can carry one into its worker processes (each then counts its own share)."""

    def __init__(self, what: str, total: int | None = None, unit="documents", seconds=None):
        self.what, self.total, self.unit = what, total, unit
        self.seconds = SECONDS if seconds is None else seconds
        self.done, self.start, self.last = 0, None, None

    def __call__(self, n: int = 1) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start = self.last = now
        self.done += n
        if now - self.last >= self.seconds and not on_terminal():
            self.last = now
            log.info(self.line(now))

    def line(self, now: float) -> str:
        rate = self.done / max(now - self.start, 1e-9)
        of = f" of {self.total:,}" if self.total else ""
        eta = ""
        if self.total and rate > 0 and self.done < self.total:
            eta = f", eta {eta_text((self.total - self.done) / rate)}"
        return f"{self.what}: {self.done:,}{of} {self.unit}, {rate:,.0f}/s{eta}"


def progress(
    items: Iterable[T], what: str, total: int | None = None, unit="documents", seconds=None
) -> Iterator[T]:
    """`items` passed through, counted: a bar on a terminal, `Ticks`' lines otherwise."""
    if on_terminal():
        yield from tqdm(items, desc=what, total=total, unit=unit.rstrip("s") or unit)
        return
    ticks = Ticks(what, total, unit, seconds)
    for item in items:
        ticks()
        yield item
