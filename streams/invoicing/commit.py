"""The one commit point of the invoicing worker: database commit, then offset commit.

Order, and why:

1. the records' effects are written in **one database transaction** whose first
   statement is the fence check (:func:`streams.billing.fencing.check`), and it
   commits;
2. only then are the Kafka offsets (the next offset to read, per partition)
   committed, **synchronously**.

A crash between 1 and 2 redelivers records whose effects are already stored;
every write is idempotent (usage by event id, invoices by (customer, period,
revision) with ``ON CONFLICT DO NOTHING``, outbox rows only with a new invoice),
so redelivery changes nothing. The other order could lose records: offsets
committed, database write lost. Auto-commit and offset auto-store are off
(:func:`streams.adapters.kafka.consumer_config`).

A failed offset commit (rebalance in progress, fenced generation) is counted
and logged; the records are redelivered to whoever owns the partition next. The
invoicing worker retries it on each poll while it keeps the partition, so that
the committed offset catches up even when no later record arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg_pool import ConnectionPool

from streams.billing import fencing
from streams.invoicing.metrics import OFFSET_COMMIT_FAILURES

log = logging.getLogger("streams.invoicing.commit")

T = TypeVar("T")


def write_fenced(
    pool: ConnectionPool[Any], token: fencing.FencingToken, work: Callable[[Any], T]
) -> T:
    """Step 1: run ``work(conn)`` in one transaction that starts with the fence check,
    and commit it.

    Raises:
        fencing.Fenced: the partition's fence moved on; nothing was written.
        psycopg.Error: the database failed; nothing was written.
    """
    with pool.connection() as conn, conn.transaction():
        fencing.check(conn, token)
        return work(conn)


def commit_offsets(consumer: Consumer, offsets: list[TopicPartition]) -> bool:
    """Step 2, only after step 1 committed: commit ``offsets`` (next offsets to read)
    synchronously. Returns False (counted, logged) when the broker refused."""
    if not offsets:
        return True
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:
        OFFSET_COMMIT_FAILURES.inc()
        log.warning(
            "offset commit failed after the database commit (records will be redelivered): %s",
            exc.args[0] if exc.args else exc,
        )
        return False
    return True


def write_then_commit(
    pool: ConnectionPool[Any],
    token: fencing.FencingToken,
    work: Callable[[Any], T],
    consumer: Consumer,
    offsets: list[TopicPartition],
) -> T:
    """The commit point: :func:`write_fenced`, then :func:`commit_offsets`."""
    result = write_fenced(pool, token, work)
    commit_offsets(consumer, offsets)
    return result
