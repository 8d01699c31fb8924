"""What a replay run found and did: per-customer outcomes and the run's report (JSON).

:class:`ReplayReport` is what :func:`streams.apps.replay.run.replay_period` returns and
``invoicing replay`` prints and writes (``reports/replay-<period>-<run>.json``);
:class:`CustomerOutcome` is one customer's line of it. Money in the JSON is
strings; times are seconds of wall-clock time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from streams.apps.replay import store as rstore
from streams.apps.replay.diff import CustomerDiff
from streams.apps.replay.reader import Window
from streams.apps.replay.rebuild import Conflict, InvalidRecord

__all__ = ["CustomerOutcome", "Mode", "ReplayReport", "outcome_from_stored"]


class Mode(StrEnum):
    DRY_RUN = "dry_run"
    APPLY = "apply"


@dataclass(frozen=True)
class CustomerOutcome:
    """What the run found (and, for an apply, did) for one customer.

    ``outcome``: ``unchanged``; ``difference`` (dry run); ``corrected`` (credit
    note + new revision) or ``invoiced`` (missing invoice issued as revision 1)
    (apply); ``skipped`` (``reason`` says why: held, not_closed, voided,
    incomplete_window); ``failed`` (``transient`` True: a resume retries it).
    ``difference`` is :meth:`CustomerDiff.to_json` (money as strings).
    ``previous_attempt``: recorded by an earlier attempt of a resumed run.
    """

    customer_id: str
    outcome: str
    reason: str = ""
    diff: CustomerDiff | None = None
    difference: dict[str, Any] | None = None
    transient: bool = False
    old_invoice_id: str | None = None
    new_invoice_id: str | None = None
    new_invoice_number: str | None = None
    revision: int | None = None
    credit_note_id: str | None = None
    credit_note_number: str | None = None
    previous_attempt: bool = False

    @property
    def is_difference(self) -> bool:
        return self.outcome in ("difference", "corrected", "invoiced")

    def to_json(self) -> dict[str, Any]:
        return {
            "customer_id": self.customer_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "transient": self.transient,
            "old_invoice_id": self.old_invoice_id,
            "new_invoice_id": self.new_invoice_id,
            "new_invoice_number": self.new_invoice_number,
            "revision": self.revision,
            "credit_note_id": self.credit_note_id,
            "credit_note_number": self.credit_note_number,
            "previous_attempt": self.previous_attempt,
            "difference": self.difference,
        }


def outcome_from_stored(row: rstore.ResultRow) -> CustomerOutcome:
    detail = row.detail
    return CustomerOutcome(
        customer_id=row.customer_id,
        outcome=row.outcome,
        reason=str(detail.get("reason") or ""),
        difference=detail.get("difference"),
        old_invoice_id=row.old_invoice_id,
        new_invoice_id=row.new_invoice_id,
        new_invoice_number=detail.get("new_invoice_number"),
        revision=detail.get("revision"),
        credit_note_id=row.credit_note_id,
        credit_note_number=detail.get("credit_note_number"),
        previous_attempt=True,
    )


@dataclass
class ReplayReport:
    """The outcome of a run; :meth:`to_dict` is the JSON report.

    Times: ``read_s`` (the re-read), ``elapsed_s`` (the whole run), wall-clock seconds.
    """

    run_id: str
    period: str
    mode: Mode
    resumed: bool
    attempt: int
    topic: str
    consumer_group: str
    window: Window
    lease_name: str
    holder: str
    fencing_token: int
    status: str = "running"
    events_read: int = 0
    read_s: float = 0.0
    usage_events: int = 0
    #: distinct usage.metered events of the period re-read
    metered_events: int = 0
    #: the price book the run rated under ("published (…)" or "candidate FILE (…)")
    price_book: str = ""
    duplicates: int = 0
    conflicts: list[Conflict] = field(default_factory=list)
    invalid: list[InvalidRecord] = field(default_factory=list)
    outcomes: list[CustomerOutcome] = field(default_factory=list)
    open_apply_run: str | None = None
    elapsed_s: float = 0.0

    @property
    def events_per_s(self) -> float:
        return self.events_read / self.read_s if self.read_s > 0 else 0.0

    @property
    def differences(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.is_difference]

    @property
    def skipped(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.outcome == "skipped"]

    @property
    def failed(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.outcome == "failed"]

    @property
    def unchanged(self) -> int:
        return sum(1 for o in self.outcomes if o.outcome == "unchanged")

    @property
    def complete(self) -> bool:
        """True when nothing is left for a resume (no transient failure)."""
        return not any(o.transient for o in self.failed)

    def summary(self) -> dict[str, Any]:
        return {
            "customers": len(self.outcomes),
            "differences": len(self.differences),
            "unchanged": self.unchanged,
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "corrected": sum(1 for o in self.outcomes if o.outcome == "corrected"),
            "invoiced": sum(1 for o in self.outcomes if o.outcome == "invoiced"),
            "events_read": self.events_read,
            "read_s": round(self.read_s, 3),
            "events_per_s": round(self.events_per_s, 1),
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "period": self.period,
            "mode": str(self.mode),
            "status": self.status,
            "resumed": self.resumed,
            "attempt": self.attempt,
            "topic": self.topic,
            "consumer_group": self.consumer_group,
            "window": {
                "since": self.window.since.isoformat(),
                "partitions": {
                    str(p): {"start": s, "end": e} for p, (s, e) in self.window.bounds().items()
                },
                "records": self.window.total,
            },
            "lease": {
                "name": self.lease_name,
                "holder": self.holder,
                "fencing_token": self.fencing_token,
            },
            "open_apply_run": self.open_apply_run,
            "summary": self.summary(),
            "usage_events": self.usage_events,
            "metered_events": self.metered_events,
            "price_book": self.price_book,
            "duplicates": self.duplicates,
            "conflicts": [
                {
                    "event_id": c.event_id,
                    "customer_id": c.customer_id,
                    "billing_period": c.billing_period,
                    "kept": {"partition": c.kept.partition, "offset": c.kept.offset},
                    "dropped": {"partition": c.dropped.partition, "offset": c.dropped.offset},
                }
                for c in self.conflicts
            ],
            "invalid_records": [
                {
                    "partition": r.at.partition,
                    "offset": r.at.offset,
                    "customer_id": r.customer_id,
                    "reason": r.reason,
                }
                for r in self.invalid
            ],
            "differences": [o.to_json() for o in self.differences],
            "skipped": [o.to_json() for o in self.skipped],
            "failed": [o.to_json() for o in self.failed],
        }
