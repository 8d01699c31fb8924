"""One drill run in either mode: the only module of the package that starts the naive design.

Light at import (the command's option type, :class:`DrillMode`, is defined here);
the mode's module is imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from streams.settings import Settings

if TYPE_CHECKING:  # the config pulls in the tax client's wire module: only when a drill runs
    import redis
    from confluent_kafka import Producer

    from streams.apps.importers.close_period import ClosePeriodRun
    from streams.devtools.drill.config import DrillConfig
    from streams.devtools.drill.report import DrillReport


class DrillMode(StrEnum):
    """``naive``: the design that failed (expects duplicates); ``safe``: the pipeline."""

    naive = "naive"
    safe = "safe"


@dataclass(frozen=True)
class DrillClients:
    """What the runs get from the composition root (:func:`streams.bootstrap.drill_clients`).

    Each builds for the settings it is given: the drill's own, or the sandbox's
    (the safe run makes its settings inside its sandbox).

    Attributes:
        redis: naive: the workers' shared Redis client (queue and locks).
        producer: safe: the producer of the usage events.
        close_period: safe: close-period with its clients wired in.
    """

    redis: Callable[[Settings], redis.Redis]
    producer: Callable[[Settings], Producer]
    close_period: ClosePeriodRun


def run_drill(
    mode: DrillMode,
    settings: Settings,
    config: DrillConfig,
    workdir: Path,
    *,
    run_tag: str,
    clients: DrillClients,
    progress: Callable[[str], None] | None = None,
) -> DrillReport:
    """Run ``mode`` on the seed's customers; the report says whether its expectation holds.

    Raises:
        streams.devtools.drill.DrillError: the run could not complete (a timeout, a dead worker).
        streams.devtools.sandbox.smtp.SmtpSinkError: the SMTP sink did not start.
    """
    if mode is DrillMode.naive:
        from streams.devtools.drill.naive import run_naive

        return run_naive(
            settings,
            config,
            workdir,
            run_tag=run_tag,
            redis_conn=clients.redis(settings),
            progress=progress,
        )
    from streams.devtools.drill.safe import run_safe

    return run_safe(
        settings,
        config,
        workdir,
        run_tag=run_tag,
        producer=clients.producer,
        close_period=clients.close_period,
        progress=progress,
    )
