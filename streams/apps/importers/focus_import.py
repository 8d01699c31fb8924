"""``invoicing import focus PATH``: a FOCUS 1.0 CSV → ``billing.account-events.v1``.

Reader processes (:mod:`streams.apps.importers.focus_reader`, decision 0101) read the
file with :func:`streams.core.domain.focus.iter_focus_rows` (the mapping and its row
errors live there) and encode the records; this process produces them, in file order:

* one ``customer.upserted`` per account, just before that account's first
  usage (and again, with its new deterministic id, should a later row carry
  other account details); id = :func:`streams.core.domain.focus.customer_event_id`;
* one ``usage.recorded`` per row; id = the row's FOCUS ``Id``, CloudEvents
  ``time`` = ``ChargePeriodStart``.

Each event is encoded as :func:`streams.core.domain.codec.encode` would (CloudEvents
binary content mode; record key = customer id) with source
``/importers/focus/<file name>``, to the account-events topic under
``settings.kafka.topic_prefix`` (:data:`streams.topics.ACCOUNT_EVENTS`), by the
producer the caller gives, built by :func:`streams.bootstrap.producer` (murmur2
partitioner, idempotent, ``acks=all``). Per-customer order holds because one key goes to one partition
and the idempotent producer keeps a partition's order across retries: a
customer's ``customer.upserted`` precedes its usage.

Hot path (docs/decisions/0081-focus-import.md): a row's ``usage.recorded`` is encoded by
:class:`UsageEncoder` straight from the mapped row's
:class:`~streams.core.domain.focus.UsageFields`, without a pydantic object per row; the bytes are
those of ``encode(Envelope.wrap(...))`` (tested on every sample row and on unusual values). Delivery
reports are served every 1,000 records, not after each.

The Kafka record timestamp is the produce time (the client's default
``CreateTime``), not the event time: usage of a billing period is therefore
never timestamped before it was recorded, which is what close-period's
``offsets_for_times`` scan relies on (see :mod:`streams.apps.importers.close_period`).

Delivery: every record's delivery report is checked; the producer is flushed at
the end (up to ``flush_timeout_s``, default 150 s, above librdkafka's
``message.timeout.ms`` of 120 s). A failed or unconfirmed delivery is listed in
the summary's ``delivery_failures``; the CLI exits non-zero. Re-running the
import after a failure is safe: every event id is deterministic, so the
workers deduplicate what the first run did deliver.

Malformed rows: reported with their line number and reason (a WARNING log line
each, and in the summary: every skipped row, plus counts per *kind* of reason,
the reason with its quoted values and numbers blanked), and the import goes on.

Exit codes of the command (decided: skipped rows are reported loudly but are
not a failure of the import, because the rows that did map were all delivered
and a re-import of a corrected file deduplicates; ``--strict`` makes them one):

====  =========================================================================
0     every mapped row delivered (skipped rows, if any, printed)
1     a delivery failed, or Kafka did not answer / the topic is missing
2     the file cannot be imported at all (missing, no FOCUS 1.0 header)
3     ``--strict`` and at least one row was skipped
====  =========================================================================
"""

from __future__ import annotations

import csv
import functools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from confluent_kafka import KafkaError, KafkaException, Producer
from rich.progress import TaskProgressColumn, TimeRemainingColumn

from streams.adapters.progress import progress_bar
from streams.apps.importers import KafkaUnavailable, SourceUnreadable, TopicMissing
from streams.apps.importers.focus_reader import (
    CUSTOMER,
    USAGE,
    USAGE_TYPE,
    Readers,
    UsageEncoder,
    start_reader,
)
from streams.core.domain.codec import EncodedRecord
from streams.core.domain.events import CustomerUpserted, Envelope
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

logger = logging.getLogger(__name__)

__all__ = [
    "IMPORT_PRODUCER_OVERRIDES",
    "DeliveryFailure",
    "DeliveryTracker",
    "ImportFocusRun",
    "ImportSummary",
    "SkippedRow",
    "UsageEncoder",
    "account_events_topic",
    "import_focus",
    "reason_kind",
    "require_topic",
]

#: Records produced between two ``poll(0)`` calls that serve the delivery reports (a
#: ``poll`` per record cost more than the produce itself; a full local queue is
#: served at once, see :meth:`DeliveryTracker.produce`).
_POLL_EVERY = 1000

#: Producer settings of a bulk import on top of the project's (``producer_config``:
#: murmur2, idempotent, acks=all, lz4): a file import is bound by throughput, not
#: latency, so batches wait up to 100 ms (not 20) to fill, giving fewer and larger
#: compressed requests (librdkafka's ``batch.size`` default of 1 MB and
#: ``batch.num.messages`` 10,000 are large enough at this linger).
IMPORT_PRODUCER_OVERRIDES: dict[str, Any] = {"linger.ms": 100}

#: Seconds to wait for outstanding deliveries at the end (librdkafka gives up after
#: ``message.timeout.ms`` = 120 s, and reports that as a delivery error).
FLUSH_TIMEOUT_S = 150.0


@dataclass(frozen=True)
class SkippedRow:
    """A data row that did not map: physical line (header = 1), reason, its ``Id`` if any."""

    line_number: int
    reason: str
    event_id: str | None


@dataclass(frozen=True)
class DeliveryFailure:
    """A record Kafka did not confirm: which event, from which line, and the error."""

    event_id: str
    event_type: str
    customer_id: str
    line_number: int | None
    error: str


@dataclass(frozen=True)
class ImportSummary:
    """What an import did.

    Attributes:
        path: the file read.
        topic: the topic produced to.
        rows: data rows read (blank lines excluded).
        produced: ``usage.recorded`` events Kafka confirmed.
        customers_produced: ``customer.upserted`` events Kafka confirmed.
        skipped: every row that did not map, in file order.
        skipped_by_reason: counts per reason kind (:func:`reason_kind`).
        delivery_failures: every record Kafka did not confirm.
        customers: distinct customers among the mapped rows.
        periods: mapped rows per billing period (``YYYY-MM`` → count).
        elapsed_s: wall time of the whole import, counting and flush included (seconds).
    """

    path: str
    topic: str
    rows: int
    produced: int
    customers_produced: int
    skipped: tuple[SkippedRow, ...]
    skipped_by_reason: Mapping[str, int]
    delivery_failures: tuple[DeliveryFailure, ...]
    customers: int
    periods: Mapping[str, int]
    elapsed_s: float

    @property
    def rows_per_s(self) -> float:
        """Data rows per second over :attr:`elapsed_s`."""
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """Whether every mapped row (and its customer event) was delivered."""
        return not self.delivery_failures

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (the CLI's ``--json``)."""
        return {
            "path": self.path,
            "topic": self.topic,
            "ok": self.ok,
            "rows": self.rows,
            "produced": self.produced,
            "customers_produced": self.customers_produced,
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(self.skipped_by_reason),
            "skipped_rows": [
                {"line": s.line_number, "reason": s.reason, "id": s.event_id} for s in self.skipped
            ],
            "delivery_failures": [
                {
                    "event_id": f.event_id,
                    "type": f.event_type,
                    "customer_id": f.customer_id,
                    "line": f.line_number,
                    "error": f.error,
                }
                for f in self.delivery_failures
            ],
            "customers": self.customers,
            "periods": dict(self.periods),
            "elapsed_s": round(self.elapsed_s, 3),
            "rows_per_s": round(self.rows_per_s, 1),
        }


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+")


def reason_kind(reason: str) -> str:
    """A row error's reason with quoted values and numbers blanked, to count alike reasons.

    >>> reason_kind("BilledCost 'abc' is not a decimal number")
    "BilledCost '…' is not a decimal number"
    >>> reason_kind("row has 5 fields, the header has 60")
    'row has N fields, the header has N'
    """
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason))


def account_events_topic(settings: Settings) -> str:
    """The account-events topic under ``settings.kafka.topic_prefix`` (from the registry)."""
    return ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name


def require_topic(client: Any, topic: str, timeout_s: float = 10.0) -> int:
    """The partition count of ``topic``, checked before anything is produced.

    Reads the cluster's topic list (not the topic itself, which a broker with
    ``auto.create.topics.enable`` would create).

    Raises:
        KafkaUnavailable: no metadata within ``timeout_s``.
        TopicMissing: the topic does not exist.
    """
    try:
        metadata = client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailable(f"Kafka did not answer a metadata request: {exc}") from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        raise TopicMissing(
            f"topic {topic!r} does not exist (create it with `invoicing topics create`)"
        )
    return len(found.partitions)


@dataclass
class DeliveryTracker:
    """Counts delivery reports per event type and keeps every failure.

    ``callback(event_id, event_type, customer_id, line)`` gives the function to
    pass as ``on_delivery``.
    """

    delivered: Counter[str] = field(default_factory=Counter)
    failures: list[DeliveryFailure] = field(default_factory=list)
    pending: int = 0
    #: Records handed to the producer so far.
    produced: int = 0

    def callback(
        self, event_id: str, event_type: str, customer_id: str, line: int | None
    ) -> Callable[[KafkaError | None, Any], None]:
        self.pending += 1
        return functools.partial(self._report, (event_id, event_type, customer_id, line))

    def _report(
        self, ctx: tuple[str, str, str, int | None], err: KafkaError | None, _msg: Any
    ) -> None:
        self.pending -= 1
        if err is None:
            self.delivered[ctx[1]] += 1
            return
        self.fail(*ctx, error=f"{err.name()}: {err.str()}")

    def fail(
        self, event_id: str, event_type: str, customer_id: str, line: int | None, *, error: str
    ) -> None:
        failure = DeliveryFailure(event_id, event_type, customer_id, line, error)
        self.failures.append(failure)
        logger.error(
            "delivery of %s %s (customer %s, line %s) failed: %s",
            event_type,
            event_id,
            customer_id,
            line,
            error,
        )

    def produce(
        self,
        producer: Producer,
        topic: str,
        record: EncodedRecord,
        envelope: Envelope,
        line: int | None,
    ) -> None:
        """Produce ``record``, waiting for queue space when the local queue is full."""
        self.produce_record(
            producer, topic, record, (envelope.id, envelope.type, envelope.subject, line)
        )

    def produce_record(
        self,
        producer: Producer,
        topic: str,
        record: EncodedRecord,
        ctx: tuple[str, str, str, int | None],
    ) -> None:
        """:meth:`produce` with the report's context ``(event_id, event_type,
        customer_id, line)`` given directly (no envelope needed)."""
        self.produce_parts(producer, topic, record.key, record.value, list(record.headers), ctx)

    def produce_parts(
        self,
        producer: Producer,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        ctx: tuple[str, str, str, int | None],
    ) -> None:
        """:meth:`produce_record` of a record given as its parts (``headers`` a list the
        producer may keep: the hot path's, built per record)."""
        self.pending += 1
        callback = functools.partial(self._report, ctx)
        sent = cast("list[tuple[str, str | bytes | None]]", headers)  # read, never changed
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=sent, on_delivery=callback)
                break
            except BufferError:
                producer.poll(0.5)  # the local queue is full: serve delivery reports
            except KafkaException as exc:  # refused locally (e.g. too large): never sent
                self.pending -= 1
                self.fail(*ctx, error=str(exc))
                return
        self.produced += 1
        if self.produced % _POLL_EVERY == 0:
            producer.poll(0)  # serve the delivery reports received meanwhile

    def flush(self, producer: Producer, timeout_s: float) -> None:
        """Wait for every outstanding report; what is still unconfirmed is a failure."""
        left = producer.flush(timeout_s)
        if left:
            self.failures.append(
                DeliveryFailure(
                    "*", "*", "*", None, f"{left} record(s) unconfirmed after {timeout_s}s flush"
                )
            )


def _count_rows(path: Path) -> int | None:
    """Data records in the file, for the progress bar (``None`` if the CSV is not countable)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return max(0, sum(1 for row in csv.reader(handle) if row) - 1)
    except (csv.Error, UnicodeDecodeError):
        return None


@contextmanager
def _progress_bar(enabled: bool, total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(rows)``; call it with a row count every few hundred rows."""
    with progress_bar(
        enabled, middle=(TaskProgressColumn(),), end=(TimeRemainingColumn(),)
    ) as progress:
        if progress is None:
            yield lambda _rows: None
            return
        task = progress.add_task(label, total=total)
        yield lambda rows: progress.advance(task, rows)


def import_focus(
    path: Path,
    settings: Settings,
    *,
    producer: Producer,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> ImportSummary:
    """Import the FOCUS 1.0 CSV at ``path`` into the account-events topic.

    Args:
        path: the CSV file (UTF-8; a byte order mark is accepted).
        settings: the topic prefix.
        producer: the producer to use (the caller keeps it; it is flushed, not closed).
        progress: show a rich progress bar on stderr.
        flush_timeout_s: how long to wait for the last delivery reports (seconds).

    Returns:
        The :class:`ImportSummary`; check :attr:`ImportSummary.ok`.

    Raises:
        SourceUnreadable: the file is missing or its header is not FOCUS 1.0
            (nothing was produced), or it is not UTF-8 part-way (the rows
            before were produced and flushed).
        KafkaUnavailable: no metadata from Kafka; nothing was produced.
        TopicMissing: the topic does not exist; nothing was produced.
    """
    started = time.monotonic()
    topic = account_events_topic(settings)
    source = f"/importers/focus/{path.name}"
    if not path.is_file():
        raise SourceUnreadable(f"{path}: no such file")
    require_topic(producer, topic)

    usage_encoder = UsageEncoder(source)
    reader = start_reader(path, usage_encoder)
    try:
        total = _count_rows(path) if progress else None
        tracker = DeliveryTracker()
        with _progress_bar(progress, total, f"import {path.name}") as advance:
            try:
                outcome = _produce_rows(
                    reader, usage_encoder, tracker, producer, topic, path, advance
                )
            finally:
                tracker.flush(producer, flush_timeout_s)
    finally:
        reader.stop()
    skipped, customers, periods, rows = outcome

    summary = ImportSummary(
        path=str(path),
        topic=topic,
        rows=rows,
        produced=tracker.delivered["usage.recorded"],
        customers_produced=tracker.delivered["customer.upserted"],
        skipped=tuple(skipped),
        skipped_by_reason=dict(Counter(reason_kind(s.reason) for s in skipped).most_common()),
        delivery_failures=tuple(tracker.failures),
        customers=customers,
        periods=dict(sorted(periods.items())),
        elapsed_s=time.monotonic() - started,
    )
    logger.info(
        "imported %s: %d rows, %d usage + %d customer events delivered, %d skipped, "
        "%d delivery failures, %.0f rows/s",
        path.name,
        summary.rows,
        summary.produced,
        summary.customers_produced,
        len(summary.skipped),
        len(summary.delivery_failures),
        summary.rows_per_s,
    )
    return summary


def _produce_rows(
    reader: Readers,
    encoder: UsageEncoder,
    tracker: DeliveryTracker,
    producer: Producer,
    topic: str,
    path: Path,
    advance: Callable[[int], None],
) -> tuple[list[SkippedRow], int, Counter[str], int]:
    """Produce the reader's records in order; ``(skipped, customers, periods, rows)``.

    Raises:
        SourceUnreadable: the reader found no FOCUS 1.0 header (nothing produced), the
            file is not UTF-8 part-way (the rows before were produced), or the reader
            failed (its traceback is logged).
    """
    skipped: list[SkippedRow] = []
    periods: Counter[str] = Counter()
    rows = 0
    #: customer id → the value of the last customer.upserted produced for it: a
    #: reader's record that repeats it is not produced again (focus_reader ``_Accounts``)
    accounts: dict[str, bytes | None] = {}
    for kind, body in reader.messages():
        if kind == "rows":
            before = rows
            for item in body:
                tag = item[0]
                if tag == USAGE:
                    _, line, event_id, customer_id, period, key, value, ce_time = item
                    rows += 1
                    periods[period] += 1
                    tracker.produce_parts(
                        producer,
                        topic,
                        key,
                        value,
                        encoder.headers(event_id, key, ce_time),
                        (event_id, USAGE_TYPE, customer_id, line),
                    )
                elif tag == CUSTOMER:
                    _, line, event_id, customer_id, record = item
                    if accounts.get(customer_id, b"") == record.value:
                        continue
                    accounts[customer_id] = record.value
                    ctx = (event_id, CustomerUpserted.event_type, customer_id, line)
                    tracker.produce_record(producer, topic, record, ctx)
                else:
                    _, line, reason, raw_id = item
                    rows += 1
                    skipped.append(SkippedRow(line, reason, raw_id))
                    logger.warning("%s line %d skipped: %s", path.name, line, reason)
            advance(rows - before)  # the file's rows: customer events are not rows
        elif kind == "end":
            return skipped, len(body), periods, rows
        elif kind == "unreadable":
            raise SourceUnreadable(f"{path}: {body}")
        elif kind == "not-utf8":
            raise SourceUnreadable(
                f"{path}: not UTF-8 ({body}); the rows before it were produced, "
                "a re-import of the fixed file deduplicates"
            )
        else:
            logger.error("the FOCUS reader of %s failed: %s", path.name, body)
            raise SourceUnreadable(
                f"{path}: the file's reader failed: {str(body).strip().splitlines()[-1]}"
            )
    raise SourceUnreadable(
        f"{path}: the file's reader stopped without a result"
    )  # pragma: no cover


class ImportFocusRun(Protocol):
    """:func:`import_focus` with its producer wired in by the composition root
    (:func:`streams.bootstrap.run_import_focus`), for callers that run it on
    settings they make (the demo)."""

    def __call__(
        self, path: Path, settings: Settings, *, progress: bool = ...
    ) -> ImportSummary: ...
