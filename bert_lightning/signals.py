"""The signals that stop a run once its step is saved (training/interrupt.py: SaveOnInterrupt),
and the loader workers' part in it."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def ignore_stop_signals(worker_id: int) -> None:
    """A loader worker leaves the stop signals to the main process, which saves the step and
    then shuts its workers down: a signal sent to every process of the run (Ctrl-C in a
    terminal, SLURM's `--signal`) would otherwise end a worker first, and the run with it,
    unsaved. A worker whose main process is gone still exits (torch's watchdog)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
