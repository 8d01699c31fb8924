"""Progress bars of a replay run (rich, on stderr): the re-read (events/s) and the
comparison (customers/s)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

__all__ = ["EventsPerSecond", "progress_bars"]


class EventsPerSecond(ProgressColumn):
    """A rich progress column: the task's rate per second, in ``task.fields["unit"]``
    (default ``"events"``)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = str(task.fields.get("unit", "events"))
        text = f"{speed:,.0f} {unit}/s" if speed else f"- {unit}/s"
        return Text(text, style="progress.data.speed")


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Progress | None]:
    """A rich progress display on stderr (yielded), or None when ``enabled`` is False."""
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        EventsPerSecond(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with bar:
        yield bar
