"""Progress of the long commands (verify, sweep, audit, diagram, recommend).

The library reports work done through a callback, ``progress(done, total)``: `done` of `total` steps finished
(the API's ``progress=`` argument; None reports nothing). The CLI passes `bar`'s callback, a rich progress bar
on stderr that appears only when a person is watching - table output, stdout and stderr both a terminal, no
``CI`` variable, a terminal that is not dumb - and only once the run has taken `DELAY` seconds, so quick runs
print nothing extra. The bar is transient: the report alone stays on the screen.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Progress = Callable[[int, int], None]
DELAY = 0.5  # seconds before the bar appears


def checked(progress: Progress | None) -> Progress | None:
    """`progress` itself, if it is None or callable (else a UsageError naming the argument)."""
    if progress is not None and not callable(progress):
        from initadvisor.errors import UsageError

        raise UsageError(f"must be a callable progress(done, total) or None, got {type(progress).__name__}",
                         "progress")
    return progress


def tell(progress: Progress | None, done: int, total: int) -> None:
    """Report `done` of `total` steps to `progress`, if any."""
    if progress is not None:
        progress(done, total)


def watched(fmt: str) -> bool:
    """Whether a person watches this run's output: a table on a terminal (both streams), outside CI."""
    return (fmt == "table" and sys.stdout.isatty() and sys.stderr.isatty() and not os.environ.get("CI")
            and os.environ.get("TERM") != "dumb")


class _Bar:
    """A rich progress bar on stderr, started `delay` seconds after creation (if the run is still going)."""

    def __init__(self, label: str, delay: float):
        self.label, self.state, self.live, self.lock = label, (0, 0), None, threading.Lock()
        self.timer = threading.Timer(delay, self._start)
        self.timer.daemon = True
        if delay > 0:
            self.timer.start()
        else:
            self._start()

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with self.lock:
            if self.live is None:
                self.live = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
                self.task = self.live.add_task(self.label, total=self.state[1] or None, completed=self.state[0])
                self.live.start()

    def __call__(self, done: int, total: int) -> None:
        with self.lock:
            self.state = (done, total)
            if self.live not in (None, False):
                self.live.update(self.task, completed=done, total=total)

    def close(self) -> None:
        self.timer.cancel()
        with self.lock:
            if self.live not in (None, False):
                self.live.stop()
            self.live = False  # a timer that fires now starts nothing


@contextmanager
def bar(label: str, fmt: str) -> Iterator[Progress | None]:
    """The callback to pass as ``progress=``: a terminal bar when `watched(fmt)`, else None."""
    if not watched(fmt):
        yield None
        return
    b = _Bar(label, DELAY)
    try:
        yield b
    finally:
        b.close()
