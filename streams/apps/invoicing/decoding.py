"""Decoding a partition's records for the batch write: the fast path first, the reference
decoder for whatever it declines (whose verdict and reason are final), up to and
including the partition's first close marker."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from streams.core.billing import fencing, rows
from streams.core.billing.failures import classify
from streams.core.billing.rows import Record
from streams.core.domain.codec import KEY_ID_HEADER, decode
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.fastcodec import FastUsage, decode_usage, key_id

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = [
    "ACCOUNT_EVENT_TYPES",
    "Run",
    "decode_record",
    "decode_run",
    "fast_usage_row",
    "key_id_of",
]

#: The event types the worker reads; any other type on the topic is dead-lettered.
#: A new stored type is added here, to :meth:`IngestMixin._add_run` and to the batch
#: write; its failures need no new handling (streams/core/billing/failures.py).
ACCOUNT_EVENT_TYPES = (
    CustomerUpserted,
    UsageRecorded,
    BillingPeriodClosed,
    UsageMetered,
    SubscriptionStarted,
    SubscriptionChanged,
    SubscriptionEnded,
)


@dataclass
class Run:
    """One partition's records of a poll, decoded, up to and including its first marker,
    and the close markers right after it (:func:`decode_run`). ``items`` holds per
    record its fast decoding, its envelope, or why it is refused; ``followers`` the
    markers that follow ``marker`` with no other record between them, in offset order."""

    partition: int
    token: fencing.FencingToken
    first_offset: int
    items: list[tuple[Record, FastUsage | Envelope | str]] = field(default_factory=list)
    marker: tuple[Record, Envelope] | None = None
    followers: list[tuple[Record, Envelope]] = field(default_factory=list)

    @property
    def markers(self) -> list[tuple[Record, Envelope]]:
        """The run's close markers in offset order: ``marker`` and its followers."""
        return [] if self.marker is None else [self.marker, *self.followers]

    @property
    def next_offset(self) -> int:
        """Where the partition goes on after this run: the marker (its job moves past
        it), else after the last record."""
        if self.marker is not None:
            return self.marker[0].offset
        return self.items[-1][0].offset + 1

    def suspects(self) -> list[int]:
        """Offsets whose earlier dead-lettering must be looked up: refused records and
        the marker (a marker rejected before is not handed to a job again)."""
        found = [msg.offset for msg, item in self.items if isinstance(item, str)]
        found.extend(msg.offset for msg, _envelope in self.markers)
        return found


def key_id_of(msg: Record) -> str | None:
    """The id of the API key that sent ``msg`` through the ingest edge (its last header
    :data:`~streams.core.domain.codec.KEY_ID_HEADER`), or None: absent, empty, longer than
    64 bytes or not UTF-8 (:func:`streams.core.domain.fastcodec.key_id`; lineage, never
    a reason to refuse the record)."""
    raw: bytes | None = None
    for name, value in msg.headers:
        if name == KEY_ID_HEADER:
            raw = value
    if raw is None:
        return None
    try:
        return key_id(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def decode_record(msg: Record) -> FastUsage | Envelope | str:
    """The record decoded, fast path first; a refusal is its reason (a codec failure that
    is not the record's own is logged as an ALERT and still refuses it: good data is
    never dead-lettered silently for a bug, nor does a bug stall the partition)."""
    fast = decode_usage(msg.key, msg.value, msg.headers)
    if fast is not None:
        return fast
    try:
        return decode(msg.key, msg.value, msg.headers, allowed=ACCOUNT_EVENT_TYPES)
    except Exception as exc:
        failure = classify(exc)
        reason = getattr(exc, "reason", None) or failure.reason
        if not failure.permanent:
            log.error("ALERT decoding %s failed: %s", msg, failure.reason, exc_info=exc)
            reason = f"the decoder failed ({failure.reason})"
        return str(reason)


def fast_usage_row(msg: Record, fast: FastUsage) -> rows.UsageRow:
    """The usage row the batch write stores for ``msg``, which the fast path vouched for
    as ``fast``: its values, the SHA-256 of the value bytes as received (the payload
    check of :func:`streams.core.billing.store.usage.insert_usage_rows`), where it was
    read and the key id of its lineage."""
    return rows.UsageRow(
        fast.event_id,
        fast.values,
        fast.event_time,
        hashlib.sha256(msg.value or b"").hexdigest(),
        rows.SourceCoordinates(msg.topic, msg.partition, msg.offset),
        fast.key_id,
    )


def decode_run(
    partition: int, token: fencing.FencingToken, msgs: list[Record], max_markers: int = 1
) -> Run:
    """``msgs`` of ``partition`` decoded in order, up to and including the first marker,
    then up to ``max_markers - 1`` more close markers that follow it directly (the
    records after the run are handed on, or fetched again, once its jobs are done).

    A follower joins only while every record between the first marker and it is a
    close marker too, and only for a customer no earlier marker of the run names: so
    each marker's job reads exactly the usage stored before it (only markers lie
    between them), and no two jobs of a run invoice one customer
    (docs/architecture.md "Long jobs"). Raises nothing: a record that does not decode
    as a marker ends the run (it is decoded again in its own batch)."""
    run = Run(partition, token, msgs[0].offset)
    customers: set[str] = set()
    for msg in msgs:
        item = decode_record(msg)
        if isinstance(item, Envelope) and isinstance(item.data, BillingPeriodClosed):
            run.marker = (msg, item)
            customers.add(item.data.customer_id)
            break
        run.items.append((msg, item))
    else:
        return run
    after = len(run.items) + 1
    for msg in msgs[after : after + max_markers - 1]:
        follower = decode_record(msg)
        if not (
            isinstance(follower, Envelope)
            and isinstance(follower.data, BillingPeriodClosed)
            and follower.data.customer_id not in customers
        ):
            break
        customers.add(follower.data.customer_id)
        run.followers.append((msg, follower))
    return run
