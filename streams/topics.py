"""The one registry of the project's Kafka topics.

Every topic the pipeline reads or writes is declared here once: its name, key,
partition count, replication factor, cleanup policy and retention. ``invoicing
stack up`` (and ``invoicing topics create``) creates them idempotently from this
list; docs and the AsyncAPI document are checked against it.

Pure: imports nothing from a Kafka client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

CleanupPolicy = Literal["delete", "compact", "compact,delete"]

#: Milliseconds in a day.
_DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """One topic: name, the event types it carries, and the configuration it is created with.

    ``event_types`` are the CloudEvents ``type`` names of the records on the topic,
    in the order the contracts list them (``schemas/``, the AsyncAPI document);
    :func:`streams.core.domain.events.event_models` maps them to their data models. A
    dead-letter topic carries no event type of its own (its records are copies).
    Kept as names so that this module imports no domain code.

    ``retention_ms`` of ``-1`` keeps records forever (the account events are the
    system of record that a replay re-reads, so they are never deleted by age).
    """

    name: str
    partitions: int
    key: str
    description: str
    event_types: tuple[str, ...] = ()
    replication_factor: int = 1
    cleanup_policy: CleanupPolicy = "delete"
    retention_ms: int = -1
    extra_config: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, str]:
        """Topic-level configuration as the admin API takes it."""
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            **self.extra_config,
        }

    def with_prefix(self, prefix: str) -> TopicSpec:
        """The same topic under ``prefix + name`` (tests use their own topics)."""
        if not prefix:
            return self
        return TopicSpec(
            name=prefix + self.name,
            partitions=self.partitions,
            key=self.key,
            description=self.description,
            event_types=self.event_types,
            replication_factor=self.replication_factor,
            cleanup_policy=self.cleanup_policy,
            retention_ms=self.retention_ms,
            extra_config=dict(self.extra_config),
        )


ACCOUNT_EVENTS = TopicSpec(
    name="billing.account-events.v1",
    partitions=12,
    key="customer_id",
    description="customer.upserted, usage.recorded, billing_period.closed (CloudEvents, binary mode)",
    event_types=(
        "customer.upserted",
        "usage.recorded",
        "billing_period.closed",
        "usage.metered",
        "subscription.started",
        "subscription.changed",
        "subscription.ended",
    ),
    retention_ms=-1,
)

ACCOUNT_EVENTS_DLQ = TopicSpec(
    name="billing.account-events.dlq.v1",
    partitions=12,
    key="customer_id",
    description="records the invoicing workers could not take, with reason and source coordinates",
    retention_ms=-1,
)

INVOICES = TopicSpec(
    name="billing.invoices.v1",
    partitions=12,
    key="customer_id",
    description="invoice.issued, credit_note.issued, invoice.voided from the outbox (Debezium EventRouter)",
    event_types=("invoice.issued", "credit_note.issued", "invoice.voided"),
    retention_ms=-1,
)

INVOICES_DLQ = TopicSpec(
    name="billing.invoices.dlq.v1",
    partitions=12,
    key="customer_id",
    description="records of billing.invoices.v1 the email sender could not decode, with reason "
    "and source coordinates",
    retention_ms=-1,
)

PRICE_BOOK = TopicSpec(
    name="billing.price-book.v1",
    partitions=1,
    key="entry key: metric/<code> or plan/<plan code>/<version>",
    description="billable_metric.published, plan_version.published: the published price book "
    "(`invoicing plans publish`), one record per immutable entry, compacted",
    event_types=("billable_metric.published", "plan_version.published"),
    cleanup_policy="compact",
    retention_ms=-1,
)

#: Debezium's heartbeats of the outbox connector, ``<topic.heartbeat.prefix>.<topic.prefix>``
#: of connectors/outbox-connector.json. Not an event topic (no contract, no consumer, not
#: in :data:`REGISTRY`); created with the registry's topics
#: (:func:`streams.adapters.kafka.topic_specs`), since the broker creates none by itself.
#: The heartbeats run a statement that writes a logical decoding message, so that the
#: replication slot moves on while the outbox is quiet (docs/operations.md "The
#: replication slot between closes").
OUTBOX_HEARTBEAT = TopicSpec(
    name="debezium-heartbeat.invoicing-outbox",
    partitions=1,
    key="the connector's logical name",
    description="Debezium heartbeats of the outbox connector (internal; no contract)",
    retention_ms=_DAY_MS,
)

#: Every topic of the pipeline, in creation order.
REGISTRY: tuple[TopicSpec, ...] = (
    ACCOUNT_EVENTS,
    ACCOUNT_EVENTS_DLQ,
    INVOICES,
    INVOICES_DLQ,
    PRICE_BOOK,
)

#: Dead-letter topic → (the topic its records were read from, who refuses them there).
DEAD_LETTER_TOPICS: dict[str, tuple[str, str]] = {
    ACCOUNT_EVENTS_DLQ.name: (ACCOUNT_EVENTS.name, "the invoicing workers"),
    INVOICES_DLQ.name: (INVOICES.name, "the email sender"),
}


#: The topics an outbox row may name in ``aggregatetype`` (Debezium's EventRouter routes the
#: row there): the invoices topic, under any topic prefix of dot-ended segments (``t1a2b.``,
#: ``test.run7.``; test sandboxes use one) and nothing else, so that no login that may
#: insert outbox rows can put a record on the account events or any other topic
#: (docs/security.md "The outbox"). One regular expression for Python's ``re`` and
#: PostgreSQL's ``~`` (the CHECK of migration 0015, and the memory twin's). At most
#: :data:`MAX_TOPIC_NAME` characters, Kafka's limit.
OUTBOX_ROUTE_PATTERN = r"^([A-Za-z0-9_-]+\.)*" + INVOICES.name.replace(".", r"\.") + "$"

#: Kafka's longest topic name.
MAX_TOPIC_NAME = 249


def is_outbox_route(name: str) -> bool:
    """Whether an outbox row may name ``name`` as its topic (:data:`OUTBOX_ROUTE_PATTERN`)."""
    return len(name) <= MAX_TOPIC_NAME and re.fullmatch(OUTBOX_ROUTE_PATTERN, name) is not None


def by_name(name: str) -> TopicSpec:
    """The registered topic called ``name``.

    Raises:
        KeyError: no topic of that name is registered.
    """
    for spec in REGISTRY:
        if spec.name == name:
            return spec
    raise KeyError(f"no topic named {name!r} in streams.topics.REGISTRY")
