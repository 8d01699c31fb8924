"""Dead letters of the invoicing worker: one builder for every path.

A record leaves its partition as a dead letter for one of four reasons (the
``kind`` of ``dead_letters``, migration 0007): ``invalid`` (it does not decode),
``conflict`` (its event id is stored with another payload: usage, metered usage or
a subscription event), ``unwritable`` (valid, but PostgreSQL refused it: found by
bisecting a batch) and ``rejected`` (a close marker whose invoice a permanent rule
refused). Whatever the reason, the same three things are built from the record
here, by :func:`build`:

* the :class:`~streams.core.billing.dead_letters.Letter` to produce (the original key,
  value and headers, the reason and the source coordinates);
* the ``dead_letters`` row, written in the transaction that moves past the record;
* the holds: every customer the record could belong to (its key, its ``ce_subject``,
  its value's ``customer_id``: :func:`~streams.core.billing.dead_letters.customers_of`),
  for the period it names, or the one customer and period the caller knows.

A record attributable to nobody is dead-lettered all the same, with a reason that
says no invoice is held (docs/decisions/0007-holds-instead-of-partial-invoices.md).
The worker submits the letter, waits for the broker before its transaction, and
writes the row and the holds in it (:mod:`streams.apps.invoicing.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.core.billing import rows
from streams.core.billing.dead_letters import Letter, customers_of, header_text, period_of
from streams.core.billing.rows import Record

__all__ = ["DeadLetter", "build", "unattributed_reason"]


@dataclass(frozen=True)
class DeadLetter:
    """What dead-lettering one record means: the letter, its ``dead_letters`` row and
    its holds (empty when it names no customer)."""

    letter: Letter
    record: rows.DeadLetterRecord
    holds: list[rows.HoldRequest] = field(default_factory=list)

    @property
    def attributed(self) -> bool:
        return bool(self.record.customers)


def unattributed_reason(reason: str) -> str:
    """``reason`` with what it means that the record names no customer."""
    return (
        f"{reason}; could not be attributed to a customer (no usable UTF-8 key, "
        "ce_subject header or customer_id in the value): no invoice is held"
    )


def build(
    msg: Record,
    kind: str,
    reason: str,
    dlq_topic: str,
    *,
    customer: tuple[str, str | None] | None = None,
    event_id: str | None = None,
    hold_reason: str | None = None,
) -> DeadLetter:
    """The dead letter of ``msg`` (read at its own coordinates) for ``kind`` and ``reason``.

    Args:
        msg: the record as it was read (its key, value and headers are kept).
        kind: ``invalid``, ``conflict``, ``unwritable`` or ``rejected``.
        reason: why, for ``dlq.reason`` and the ``dead_letters`` row.
        dlq_topic: the dead-letter topic.
        customer: ``(customer id, billing period or None for every period)`` when the
            caller knows whom the record holds (a decoded record); otherwise every
            customer the record could belong to, for the period it names.
        event_id: the record's event id when known (default: its ``ce_id`` header).
        hold_reason: the holds' reason (default: ``dead-lettered: <reason>``, with the
            customers it was attributed to when there are several).
    """
    source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
    event = event_id if event_id is not None else header_text(msg, "ce_id")
    if customer is not None:
        customers = [customer[0]]
        periods: dict[str, str | None] = {customer[0]: customer[1]}
    else:
        customers = customers_of(msg)
        period = period_of(msg)
        periods = dict.fromkeys(customers, period)
        if not customers:
            reason = unattributed_reason(reason)
    letter = Letter(
        msg.key,
        msg.value,
        list(msg.headers),
        source.topic,
        source.partition,
        source.offset,
        kind,
        reason,
        bool(customers),
    )
    record = rows.DeadLetterRecord(
        source.topic, source.partition, source.offset, dlq_topic, kind, reason, event, customers
    )
    if hold_reason is None:
        several = f" (attributed to {', '.join(customers)})" if len(customers) > 1 else ""
        hold_reason = f"dead-lettered: {reason}{several}"
    holds: list[rows.HoldRequest] = [
        {
            "customer_id": name,
            "billing_period": periods[name],
            "reason": hold_reason,
            "event_id": event,
            "source": source,
        }
        for name in customers
    ]
    return DeadLetter(letter, record, holds)
