"""``invoicing replay YYYY-MM --dry-run | --apply``: re-read a billing period, report its
differences from what was issued, and correct them with credit notes and new revisions.

Public API::

    replay_period(period, settings, *, mode: Mode, margin=DEFAULT_MARGIN, pool=None,
                  redis_conn=None, tax=None, progress=True, holder=None, lease_ttl_s=30.0,
                  lease_key_prefix=DEFAULT_KEY_PREFIX, on_step=None) -> ReplayReport
    lease_name_for(period, settings) -> str      # "<topic prefix>replay:<period>"

Modules: :mod:`~streams.replay.runner` (the run), :mod:`~streams.replay.reader`
(the Kafka re-read), :mod:`~streams.replay.rebuild` and :mod:`~streams.replay.diff`
(pure), :mod:`~streams.replay.store` (SQL), :mod:`~streams.replay.cli` (the command),
:mod:`~streams.replay.errors`. Decisions: docs/replay.md.
"""

from streams.replay.errors import (
    ReplayAborted,
    ReplayError,
    ReplayStateError,
    ReplayUnavailable,
)
from streams.replay.runner import (
    DEFAULT_MARGIN,
    CustomerOutcome,
    Mode,
    ReplayReport,
    StepHook,
    lease_name_for,
    replay_period,
)

__all__ = [
    "DEFAULT_MARGIN",
    "CustomerOutcome",
    "Mode",
    "ReplayAborted",
    "ReplayError",
    "ReplayReport",
    "ReplayStateError",
    "ReplayUnavailable",
    "StepHook",
    "lease_name_for",
    "replay_period",
]
