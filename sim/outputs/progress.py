"""Progress of long commands on stderr (``clustersim validate``, ``sweep``, ``study``; a
spinner while ``run`` or ``plot`` simulates): a rich bar with elapsed time and ETA when
stderr is a terminal, otherwise a plain line at most every 3 s (``CLUSTERSIM_PROGRESS_EVERY``
seconds), so a log or CI shows the command is alive without being flooded. stdout is
never touched.
"""

from contextlib import contextmanager
import os
import sys
import time


def _every() -> float:
    """Seconds between plain progress lines: CLUSTERSIM_PROGRESS_EVERY, default 3."""
    try:
        return max(0.0, float(os.environ.get("CLUSTERSIM_PROGRESS_EVERY", "3")))
    except ValueError:
        return 3.0


def escape(text: str) -> str:
    """``text`` shown as is by rich (a scenario name may hold ``[...]``, rich's markup)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _terminal() -> bool:
    return sys.stderr.isatty()


class Progress:
    """``with Progress("validate", 13) as p: ... p.advance("N21-T1 GPT 39.1B")``."""

    def __init__(self, label: str, total: int, quiet: bool = False, transient: bool = False,
                 every: float | None = None):
        self.label, self.total, self.done = label, total, 0
        self.quiet, self.transient = quiet or total == 0, transient
        self.every = _every() if every is None else every
        self._bar = self._task = None
        self._printed = False  # plain mode: the last line is printed only after an earlier one
        self._start = self._last = time.monotonic()

    def __enter__(self):
        if not self.quiet and _terminal():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = Bar(TextColumn(escape(self.label)), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"),
                            console=Console(stderr=True), transient=self.transient)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def advance(self, note: str = "", n: int = 1) -> None:
        """``n`` more steps done; ``note`` says which (shown beside the bar / in the line)."""
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n, description=escape(note))
            return
        now = time.monotonic()
        due = now - self._last >= self.every or (self._printed and self.done >= self.total)
        if self.quiet or not due:
            return
        self._last, self._printed = now, True
        print(f"{self.label}: {self.done}/{self.total}{f' ({note})' if note else ''}, "
              f"{now - self._start:.0f} s", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


@contextmanager
def status(text: str, quiet: bool = False):
    """A spinner with ``text`` while the block runs on a terminal (one simulation has no steps
    to count); elsewhere (a log, CI, a pipe) a line ``text: N s`` every few seconds
    (``CLUSTERSIM_PROGRESS_EVERY``) from a daemon thread, so a long run is seen to be alive."""
    if quiet:
        yield
        return
    if not _terminal():
        with _heartbeat(text, max(_every(), 0.1)):
            yield
        return
    from rich.console import Console

    with Console(stderr=True).status(escape(text)):
        yield


@contextmanager
def _heartbeat(text: str, every: float):
    """Print ``text: N s`` on stderr every ``every`` seconds until the block ends."""
    import threading

    done, start = threading.Event(), time.monotonic()

    def beat():
        while not done.wait(every):
            print(f"{text}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, name="clustersim-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
