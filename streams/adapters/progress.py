"""Progress bars on stderr for the commands' long steps (rich), or none.

The import, close-period (and the replay's reader) show the same kind of bar:
a description, the bar, done/total and the elapsed time, with a few columns of
their own. :func:`progress_bar` builds it once; ``enabled=False`` (``--no-progress``,
tests, pipes) yields None so that the caller skips every update.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)


@contextmanager
def progress_bar(
    enabled: bool,
    *,
    middle: Sequence[ProgressColumn] = (),
    end: Sequence[ProgressColumn] = (),
) -> Iterator[Progress | None]:
    """A live :class:`rich.progress.Progress` on stderr, or None when not ``enabled``.

    Columns: bold description, bar, ``done/total``, then ``middle``, the elapsed
    time, then ``end``. The bar stops (and leaves its last state) on exit.
    """
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *middle,
        TimeElapsedColumn(),
        *end,
        console=Console(stderr=True),
    )
    with bar:
        yield bar
