"""The signals that stop a run: Ctrl-C (SIGINT), a scheduler's SIGTERM, SLURM's SIGUSR1. Every
phase of a run stops on them within seconds: `Stops` raises `Interrupted` at once wherever the
run is (a data pass, a validation or test outside the fit, what follows the fit), except while
a fit trains, where SaveOnInterrupt (training/interrupt.py) saves the step first."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from bert_lightning.errors import UserError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
GRACE = 5.0  # seconds a raised stop may take to unwind before the process ends regardless


class Interrupted(UserError):
    """A run stopped by a signal. It exits with 128 + the signal's number, as a shell reports a
    process the signal ended (a batch script tells a run to requeue from a failed one), and its
    line says the stop was asked for: it is no error."""

    label = "stopped on request"

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class Stops:
    """The stop signals of a run (`stops_on_signals`), the first one's number `received`. A
    signal raises Interrupted at once in the main thread, `<SIGNAL> <where>` (where the run
    stands), unless the run `defer`s it: a fit acts on `received` at its next check (the
    optimizer step in progress done, the next validation batch), once it saved its step. Only
    one is raised: a signal while the run unwinds would cut its clean-up short."""

    def __init__(self, where: str):
        self.where = where
        self.received = 0
        self.deferred = False
        self.raised = False
        self.pid = os.getpid()
        self.replaced: dict = {}
        self.unwound = threading.Event()  # set when the run's scope is left (stops_on_signals)

    def __call__(self, signum, frame) -> None:
        if os.getpid() != self.pid:  # a process forked from the run's (a datasets pool
            signal.signal(signum, signal.SIG_DFL)  # worker) ends by it, as without this handler
            os.kill(os.getpid(), signum)
            return
        self.received = self.received or signum
        if not (self.deferred or self.raised):
            raise self.stop(self.where)

    def stop(self, what: str) -> Interrupted:
        """The run's Interrupted, `<SIGNAL> <what>`; later signals are only recorded. An
        exception raised where a signal lands can leave a library's clean-up waiting on a
        process the signal ended (a data pass's pool): after `GRACE` seconds a watchdog ends
        the process's children and the process itself, with the same line and exit code."""
        self.raised = True
        stopped = Interrupted(f"{signal.Signals(self.received).name} {what}", self.received)
        threading.Thread(target=self._end_if_stuck, args=(stopped,), daemon=True).start()
        return stopped

    def _end_if_stuck(self, stopped: Interrupted) -> None:
        if self.unwound.wait(GRACE):
            return
        for child in descendants(os.getpid()):
            with suppress(ProcessLookupError):  # ended meanwhile
                os.kill(child, signal.SIGKILL)
        os.write(2, f"{stopped.label}: {stopped} (ended {GRACE:.0f} s after it)\n".encode())
        os._exit(stopped.exit_code)

    def defer(self) -> None:
        """Signals recorded only, until `resume`; this the handler again until
        `replaced_back`: a fit's Trainer puts its own SIGTERM handler in, which would end the
        fit unsaved."""
        self.deferred = True
        self.replaced = {sig: signal.signal(sig, self) for sig in STOP_SIGNALS}

    def replaced_back(self) -> None:
        """The handlers `defer` replaced, back (the Trainer's, which it replaces by its own
        predecessor, this, as it ends)."""
        for sig, handler in self.replaced.items():
            signal.signal(sig, handler)
        self.replaced = {}

    def resume(self, where: str) -> None:
        """Signals raise at once again, saying `where`; one that came while deferred, now."""
        self.deferred, self.where = False, where
        if self.received and not self.raised:
            raise self.stop(where)


def descendants(pid: int) -> list[int]:
    """The processes `pid` started and theirs, from Linux's /proc (none where there is none):
    a data pass's pool and its manager are started by libraries the run does not track."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended, or not a process's
            continue
        if parent == pid:
            child = int(stat.parent.name)
            found += [child, *descendants(child)]
    return found


_active: Stops | None = None


@contextmanager
def stops_on_signals(where: str) -> Iterator[Stops | None]:
    """A run's `Stops` (`where`: its state until told another) as the handler of the stop
    signals inside, the previous handlers back after; None off the main thread, where Python
    runs no handler."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stops, outer = Stops(where), _active
    previous = {sig: signal.signal(sig, stops) for sig in STOP_SIGNALS}
    _active = stops
    try:
        yield stops
    finally:
        stops.unwound.set()
        _active = outer
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def active_stops() -> Stops | None:
    """The `Stops` of the run in progress, None outside one."""
    return _active


def ignore_stop_signals(worker_id: int) -> None:
    """A loader worker leaves the stop signals to the main process, which saves the step and
    then shuts its workers down: a signal sent to every process of the run (Ctrl-C in a
    terminal, SLURM's `--signal`) would otherwise end a worker first, and the run with it,
    unsaved. A worker whose main process is gone still exits (torch's watchdog)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
