"""``invoicing plans validate|publish FILE``: the price book into PostgreSQL and its topic.

**Validate** (:func:`validate_file`): read the YAML file and load it with the
rating core's validating loader (:func:`streams.core.domain.rating.load_price_book`),
which reports every error with its path and line.

**Publish** (:func:`publish_price_book`), in this order:

1. validate the file (nothing is written when it has an error);
2. one PostgreSQL transaction under an advisory lock (publications are serial):
   read every published entry, compare the file's entries with them
   (:func:`streams.core.domain.rating.published.plan_publication`) — an entry published
   with **other content** refuses the whole publication (:class:`PublicationRefused`,
   nothing written: published versions are immutable); the union of the
   published and the new entries must be a valid book (e.g. a new version may
   not go back in ``effective_from``) — then insert the new entries
   (``billable_metrics``, ``plan_versions``) and commit;
3. produce **every** published entry (not only the file's) to the compacted topic
   ``billing.price-book.v1`` (key ``metric/<code>`` / ``plan/<code>/<version>``,
   CloudEvents binary mode, a deterministic ``ce_id`` from the key and content,
   the stored ``published_at``): the same key always carries the same record, so
   re-producing is harmless under compaction, and a publication whose delivery
   failed after the commit is completed by running it again (or by any later
   publication). Delivery failures raise :class:`DeliveryIncomplete`.

The invoice job and the replay read the book from PostgreSQL; the topic is for
other readers (the usage view), who assemble it with
:func:`streams.core.domain.rating.published.assemble`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from psycopg_pool import ConnectionPool

from streams.apps.importers import ImporterError, SourceUnreadable
from streams.core.billing import store
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, deterministic_id
from streams.core.domain.rating import PriceBook, load_price_book
from streams.core.domain.rating.published import Entry, plan_publication
from streams.settings import Settings
from streams.topics import PRICE_BOOK

logger = logging.getLogger(__name__)

__all__ = [
    "SOURCE",
    "DeliveryIncomplete",
    "PublicationRefused",
    "PublishSummary",
    "entry_event_id",
    "publish_price_book",
    "read_price_book",
    "validate_file",
]

#: CloudEvents ``source`` of the price book records.
SOURCE = "/plans/publish"


class PublicationRefused(ImporterError):
    """Entries of the file are already published with other content (immutable);
    nothing was written. ``refused`` lists ``(key, reason)``."""

    def __init__(self, refused: Sequence[tuple[str, str]]) -> None:
        self.refused = tuple(refused)
        super().__init__(
            f"{len(self.refused)} entr{'y' if len(self.refused) == 1 else 'ies'} already "
            "published with other content:\n" + "\n".join(f"  {r}" for _, r in self.refused)
        )


class DeliveryIncomplete(ImporterError):
    """The entries are stored in PostgreSQL but not all reached the topic: run the
    publication again (idempotent) to complete it."""

    transient = True


def read_price_book(path: Path) -> PriceBook:
    """The validated price book of the YAML file ``path``.

    Raises:
        SourceUnreadable: the file cannot be read.
        PriceBookError: the file does not validate (``issues``: every error, by path).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceUnreadable(f"cannot read {path}: {exc}") from exc
    return load_price_book(text, source=str(path))


def validate_file(path: Path) -> PriceBook:
    """:func:`read_price_book` (the name of what ``plans validate`` does)."""
    return read_price_book(path)


def entry_event_id(entry: Entry) -> str:
    """The CloudEvents id of an entry's record: deterministic (key + content), so a
    re-produced entry deduplicates downstream."""
    return deterministic_id("price-book", entry.record_key(), entry.content_sha256)


@dataclass
class PublishSummary:
    """What a publication did: keys stored now, keys already published with the same
    content, records delivered to the topic and the book in force afterwards."""

    path: str
    topic: str
    new: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    delivered: int = 0
    metrics: int = 0
    plan_versions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "topic": self.topic,
            "new": self.new,
            "unchanged": self.unchanged,
            "delivered": self.delivered,
            "book": {"metrics": self.metrics, "plan_versions": self.plan_versions},
        }


def publish_price_book(
    path: Path,
    settings: Settings,
    *,
    pool: ConnectionPool[Any],
    producer: Producer,
    published_by: str,
    flush_timeout_s: float = 30.0,
    now: datetime | None = None,
) -> PublishSummary:
    """Publish the price book file ``path`` (module docstring for the steps).

    Raises:
        SourceUnreadable: the file cannot be read.
        PriceBookError: the file, or the union with the published entries, does not
            validate; nothing written.
        PublicationRefused: an entry is published with other content; nothing written.
        DeliveryIncomplete: stored, but not every record reached the topic.
        psycopg.Error: the database failed (nothing committed).
    """
    book = read_price_book(path)
    topic = PRICE_BOOK.with_prefix(settings.kafka.topic_prefix).name
    published_at = now or datetime.now(UTC)
    summary = PublishSummary(path=str(path), topic=topic)
    with pool.connection() as conn, conn.transaction():
        store.pricing.lock_price_book(conn)
        published = store.pricing.published_entries(conn)
        plan = plan_publication(book, published, published_at=published_at, source=str(path))
        if not plan.accepted:
            raise PublicationRefused(plan.refused)
        store.pricing.insert_entries(conn, list(plan.new), published_by=published_by)
        # read back: the database stamps published_at (and published_by) itself
        # (migration 0018), so the topic carries the stored times
        everything = store.pricing.published_entries(conn)
    summary.new = [entry.record_key() for entry in plan.new]
    summary.unchanged = [entry.record_key() for entry in plan.unchanged]
    if plan.book is not None:
        summary.metrics = len(plan.book.metrics)
        summary.plan_versions = sum(len(p.versions) for p in plan.book.plans)
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            summary.delivered += 1
        else:
            errors.append(f"{err.name()}: {err.str()}")

    for entry in everything:
        record = encode(
            Envelope.wrap(entry, id=entry_event_id(entry), source=SOURCE, time=entry.published_at)
        )
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            on_delivery=report,
        )
        producer.poll(0)
    left = producer.flush(flush_timeout_s)
    if errors or left:
        raise DeliveryIncomplete(
            f"the price book is stored, but {len(errors) + left} of {len(everything)} record(s) "
            f"did not reach {topic} ({errors[:3] or 'timeout'}): run the publication again"
        )
    logger.info(
        "published %s: %d new, %d unchanged, %d record(s) on %s",
        path,
        len(summary.new),
        len(summary.unchanged),
        summary.delivered,
        topic,
    )
    return summary
