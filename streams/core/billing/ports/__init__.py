"""Ports: the small interfaces the billing core calls, one ``typing.Protocol`` each.

Every port has a real adapter (``streams/adapters/``), an in-memory twin
(:mod:`streams.adapters.memory`) and one contract suite (``tests/contracts/``) run against both, so
the twin cannot drift from the real thing (docs/conventions.md "Ports with two implementations").

Ports, real adapters and twins::

    TaxService     streams.adapters.tax.client.HttpTaxService  streams.adapters.memory.tax.InMemoryTaxService
    TaxCache       streams.adapters.tax.cache.RedisTaxCache    streams.adapters.memory.tax_cache.InMemoryTaxCache
    MailTransport  streams.adapters.smtp.SmtpTransport       streams.adapters.memory.mail.InMemoryMailTransport
    KafkaSource    confluent_kafka.Consumer                    streams.adapters.memory.kafka.InMemoryConsumer
    KafkaSink      confluent_kafka.Producer                    streams.adapters.memory.kafka.InMemoryProducer
    Database       psycopg_pool.ConnectionPool                 streams.adapters.memory.database.InMemoryDatabase
    UsageStore …   the modules of streams.core.billing.store         the modules of streams.adapters.memory.store
    FenceStore     streams.core.billing.fencing                      streams.adapters.memory.fencing
    DeadLetterSink streams.core.billing.dead_letters.DeadLetters     streams.adapters.memory.dead_letters.InMemoryDeadLetterSink

Errors are split by what the caller does next (docs/conventions.md "Errors you can act on"): a
**transient** error means "the same call may succeed later, retry it (with the same idempotency
key), never dead-letter"; a **permanent** one means "the same input fails again: record it and move
on".

* Tax: :class:`TaxUnavailable` (transient) and :class:`TaxRejected` (permanent),
  both :class:`TaxError`, defined here because they are part of the port.
* Mail: :class:`~streams.core.billing.mail_errors.SmtpTransientError` (transient) and
  :class:`~streams.core.billing.mail_errors.SmtpPermanentError` (permanent), in the
  kernel beside this port; the email sender adds its own errors below them.

The tax port's value types (:class:`~streams.core.domain.invoice.TaxLine`,
:class:`~streams.core.domain.invoice.TaxedLine`) live in the domain; :class:`Rate`
(a code and a rate, what the cache stores per region) lives here.

The kernel's stores, fences and dead-letter sink have ports here too (:class:`UsageStore`,
:class:`InvoiceStore`, :class:`HoldStore`, :class:`CloseStore`, :class:`FenceStore`,
:class:`DeadLetterSink`). The stores are modules of functions that take an open connection first and
run inside the caller's transaction (docs/decisions/0002-stores-are-functions-of-a-connection.md),
so a store's Protocol is generic in the connection type ``C``: the PostgreSQL modules of
:mod:`streams.core.billing.store` implement ``UsageStore[psycopg.Connection[Any]]`` and so on (mypy
checks a module against a Protocol; ``tests/unit/test_ports.py`` pins it), and an in-memory twin
implements the same Protocol over its own transaction object. Pure helpers that touch no table
(``invoice_number``, ``credit_note_number``) are not part of a port. Where a connection comes from
is the :class:`Database` port (a psycopg pool, or the twin's in-memory database); which store
implementation a writer uses is a :class:`streams.core.billing.stores.Stores` set (PostgreSQL by
default).

The Kafka clients the loops use have ports too: :class:`KafkaSource` (a consumer-group
member: the invoicing worker's and the email sender's consumer) and
:class:`KafkaSink` (a producer: the dead-letter topics). They are the subset of
``confluent_kafka.Consumer`` / ``Producer`` the loops call, with librdkafka's value
types (``TopicPartition``, ``Message``, ``KafkaError``) and its exceptions
(``KafkaException`` carrying a ``KafkaError`` whose ``code()`` says what failed;
``RuntimeError`` on a closed consumer), so the real clients implement them as they
are and the worker's error handling is the same on both.
"""

from __future__ import annotations

from streams.core.billing.ports.database import (
    C_co,
    Connection,
    Database,
)
from streams.core.billing.ports.kafka import (
    DeliveryReport,
    KafkaSink,
    KafkaSource,
    RebalanceCallback,
)
from streams.core.billing.ports.mail import (
    MailTransport,
)
from streams.core.billing.ports.stores import (
    C,
    CloseStore,
    DeadLetterSink,
    DeadLetterStore,
    DraftStore,
    FenceStore,
    HoldStore,
    InvoiceStore,
    MeteringStore,
    PriceBookStore,
    UsageStore,
)
from streams.core.billing.ports.tax import (
    Rate,
    RateKey,
    TaxCache,
    TaxError,
    TaxRejected,
    TaxService,
    TaxUnavailable,
)

__all__ = [
    "C",
    "C_co",
    "CloseStore",
    "Connection",
    "Database",
    "DeadLetterSink",
    "DeadLetterStore",
    "DeliveryReport",
    "DraftStore",
    "FenceStore",
    "HoldStore",
    "InvoiceStore",
    "KafkaSink",
    "KafkaSource",
    "MailTransport",
    "MeteringStore",
    "PriceBookStore",
    "Rate",
    "RateKey",
    "RebalanceCallback",
    "TaxCache",
    "TaxError",
    "TaxRejected",
    "TaxService",
    "TaxUnavailable",
    "UsageStore",
]
