"""Progress wherever a user waits: the long steps before training (training a tokenizer,
reading and tokenizing a corpus) count their work (`Ticks`, `progress`); the steps around it
whose work is counted elsewhere or not at all (testing the best checkpoint, a baseline's scores,
each alpha of `interpolate`, a cell of `downstream`) say what they wait on (`Waiting`). Off a
terminal a plain line every `SECONDS` seconds, so that a log file tells work from a hang; on a
terminal tqdm bars (`datasets`' own too). `SECONDS` is the cadence off a terminal: a run's
`callbacks.progress_bar.seconds`, or as shipped (conf/callbacks/_progress.yaml)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm.auto import tqdm

from bert_lightning.errors import UserError
from bert_lightning.shipped import group_defaults

log = logging.getLogger(__name__)

SECONDS = float(group_defaults("callbacks", "_progress")["progress_bar"]["seconds"])
POLL = 0.05  # seconds: the waits' shortest cadence


@contextmanager
def cadence(seconds: float | None) -> Iterator[None]:
    """A run's own `callbacks.progress_bar.seconds` for the waits and counts it starts, the
    process's again after it (None: the process's)."""
    global SECONDS
    before = SECONDS
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0
    ):
        raise UserError(f"callbacks.progress_bar.seconds={seconds!r}; expected a number >= 0")
    SECONDS = before if seconds is None else float(seconds)
    try:
        yield
    finally:
        SECONDS = before


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
            self.last = _said[0] = now  # a `Waiting` around this one has spoken
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


def say(text: str) -> None:
    """A line of `Waiting`: on stderr, as tqdm's bars, so that what a command prints on stdout
    stays its results (`downstream`'s line per cell, `evaluate`'s metrics), and into the run's
    log files (`to_log_files`); a command configures no logging to send it through."""
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank:  # a line per run, not per process
        return
    print(text, file=sys.stderr, flush=True)
    to_log_files(text)
    _said[0] = time.monotonic()


_said = [0.0]  # when `say` last wrote a line
_waits: list[Waiting] = []  # the waits under way, the outermost first


class Waiting:
    """`with Waiting(what):` around a step a user waits on whose work is not counted here.
    Off a terminal the outermost wait speaks: `what ...` when it starts, then `what: 0m45s so
    far (now: INNER)` whenever no line came for `SECONDS` (a thread keeps the time; INNER: the
    innermost wait, a step of it). On a terminal a tqdm bar of the time it has taken."""

    def __init__(self, what: str):
        self.what, self.seconds = what, SECONDS
        self.bar, self.done = None, threading.Event()
        self.thread = threading.Thread(target=self.beat, name="progress", daemon=True)

    def __enter__(self) -> Waiting:
        self.start = time.monotonic()
        if on_terminal():
            self.bar = tqdm(desc=self.what, bar_format="{desc}: {elapsed}", leave=False)
        elif not _waits:
            say(f"{self.what} ...")
        _waits.append(self)
        self.thread.start()
        return self

    def beat(self) -> None:
        every = min(max(self.seconds, POLL), 1.0)  # a cadence of 0: a line each POLL, no spin
        while not self.done.wait(every):
            now = time.monotonic()
            if self.bar is not None:
                self.bar.refresh()
            elif _waits[0] is self and now - _said[0] >= max(self.seconds, POLL):
                inner = _waits[-1].what
                step = f" (now: {inner})" if inner != self.what else ""
                say(f"{self.what}: {eta_text(now - self.start)} so far{step}")

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        _waits.remove(self)
        if self.bar is not None:
            self.bar.close()


def to_log_files(text: str) -> None:
    """`text`, printed already, into the log files of the root logger too (Hydra's job log,
    `train.log`), as an INFO record of this module: through logging it would reach the
    console handler as well, and show twice."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)
