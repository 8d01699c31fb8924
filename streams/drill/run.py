"""One drill run in either mode: the only module of the package that starts the naive design.

Light at import (the command's option type, :class:`DrillMode`, is defined here);
the mode's module is imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from streams.drill.config import DrillConfig
from streams.drill.report import DrillReport
from streams.settings import Settings


class DrillMode(StrEnum):
    """``naive``: the design that failed (expects duplicates); ``safe``: the pipeline."""

    naive = "naive"
    safe = "safe"


def run_drill(
    mode: DrillMode,
    settings: Settings,
    config: DrillConfig,
    workdir: Path,
    *,
    run_tag: str,
    progress: Callable[[str], None] | None = None,
) -> DrillReport:
    """Run ``mode`` on the seed's customers; the report says whether its expectation holds.

    Raises:
        streams.drill.DrillError: the run could not complete (a timeout, a dead worker).
        streams.sandbox.smtp.SmtpSinkError: the SMTP sink did not start.
    """
    if mode is DrillMode.naive:
        from streams.drill.naive import run_naive

        return run_naive(settings, config, workdir, run_tag=run_tag, progress=progress)
    from streams.drill.safe import run_safe

    return run_safe(settings, config, workdir, run_tag=run_tag, progress=progress)
