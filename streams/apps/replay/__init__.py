"""``invoicing replay YYYY-MM --dry-run | --apply``: re-read a billing period, report its
differences from what was issued, and correct them with credit notes and new revisions.

Public API::

    replay_period(period, settings, clients: ReplayClients, *, mode: Mode,
                  margin=DEFAULT_MARGIN, progress=True, holder=None, lease_ttl_s=30.0,
                  lease_key_prefix=DEFAULT_KEY_PREFIX, on_step=None,
                  candidate: CandidateBook | None = None) -> ReplayReport
    lease_name_for(period, settings) -> str      # "<topic prefix>replay:<period>"

The clients (pool, Redis, tax service, a consumer factory) come from the caller;
:func:`streams.bootstrap.replay_period` builds them from settings.

Modules: :mod:`~streams.apps.replay.run` (the run: lease, run state, re-read, finish),
:mod:`~streams.apps.replay.apply` (compare and correct one customer, through the billing
kernel's issuance), :mod:`~streams.apps.replay.report` (outcomes and the JSON report),
:mod:`~streams.apps.replay.progress` (progress bars), :mod:`~streams.apps.replay.reader` (the
Kafka re-read), :mod:`~streams.apps.replay.rebuild` and :mod:`~streams.apps.replay.diff` (pure),
:mod:`~streams.apps.replay.store` (the run state's SQL), :mod:`~streams.apps.replay.errors`; the
command is :mod:`streams.entrypoints.replay`. Decisions: docs/replay.md.
"""

from streams.apps.replay.apply import StepHook
from streams.apps.replay.errors import (
    ReplayAborted,
    ReplayError,
    ReplayStateError,
    ReplayUnavailable,
)
from streams.apps.replay.report import CustomerOutcome, Mode, ReplayReport
from streams.apps.replay.run import (
    DEFAULT_MARGIN,
    CandidateBook,
    ReplayClients,
    lease_name_for,
    replay_period,
)

__all__ = [
    "DEFAULT_MARGIN",
    "CandidateBook",
    "CustomerOutcome",
    "Mode",
    "ReplayAborted",
    "ReplayClients",
    "ReplayError",
    "ReplayReport",
    "ReplayStateError",
    "ReplayUnavailable",
    "StepHook",
    "lease_name_for",
    "replay_period",
]
