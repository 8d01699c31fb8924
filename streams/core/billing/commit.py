"""The one commit point: database commit, then offset commit.

Every consumer of the pipeline that commits Kafka offsets does it through a
:class:`CommitPoint` — the invoicing worker, the email sender and the replay's
re-read (docs/conventions.md "One commit point"). Order, and why:

1. the records' effects are written to PostgreSQL and **committed**: the
   invoicing worker's in one transaction whose first statement is the fence
   check (:func:`write_fenced`, :func:`streams.core.billing.fencing.check`), or the
   invoice job's issuance (:mod:`streams.core.billing.issuance`); the email sender's
   ``email_deliveries`` row made final (:mod:`streams.apps.email.store`); the replay
   writes nothing for the records it reads (its commits only record progress);
2. only then are the Kafka offsets (the next offset to read, per partition)
   committed — synchronously, except the replay's periodic progress commits.

A crash between 1 and 2 redelivers records whose effects are already stored;
every write is idempotent (usage by event id, invoices by (customer, period,
revision) with ``ON CONFLICT DO NOTHING``, outbox rows only with a new invoice,
email deliveries by event id and by document), so redelivery changes nothing.
The other order could lose records: offsets committed, database write lost.
Auto-commit and offset auto-store are off
(:func:`streams.adapters.kafka.consumer_config`).

A synchronous offset commit can wait for ever: librdkafka queues it until the
group coordinator answers, and a coordinator that a broker restart left
unreachable never does (docs/conventions.md "One commit point"; the Java
client's ``commitSync()`` without a timeout waits the same way). A consumer whose thread
waits there stops polling, leaves the group at ``max.poll.interval.ms`` and never
comes back. So a :class:`CommitPoint` given ``wait_s`` runs each synchronous
commit on a thread of its own and waits at most ``wait_s``: a commit not answered
by then is reported as refused (logged, counted) while it goes on waiting, the
caller's poll loop goes on, and while it waits every later commit is refused at
once (it would only queue behind it) until it ends.

A refused offset commit (a rebalance in progress, a fenced generation) is
logged and counted (``invoicing_offset_commit_failures_total``, except the
replay's progress commits) and reported to the caller as ``False``; the records
are redelivered to whoever owns the partition next. The invoicing worker
retries it on each poll while it keeps the partition, so that the committed
offset catches up even when no later record arrives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaException, TopicPartition

from streams.core.billing.fencing import Fence
from streams.core.billing.metrics import OFFSET_COMMIT_FAILURES
from streams.core.billing.ports import Connection, Database, KafkaSource
from streams.core.billing.stores import POSTGRES, Stores

log = logging.getLogger("streams.core.billing.commit")

T = TypeVar("T")
C = TypeVar("C", bound=Connection)

__all__ = ["CommitPoint", "write_fenced"]


def write_fenced(
    pool: Database[C],
    fence: Fence,
    work: Callable[[C], T],
    *,
    stores: Stores[C] | None = None,
    timeout_s: float | None = None,
) -> T:
    """Step 1 for a fenced writer: run ``work(conn)`` in one transaction that starts
    with ``fence``'s check (through ``stores``, default the PostgreSQL ones: see
    :meth:`streams.core.billing.stores.Stores.check`), and commit it. ``timeout_s`` bounds
    the wait for a connection (default: the pool's own, 30 s); the poll thread passes
    a short one.

    Raises:
        Fenced / LeaseFenced: the fence moved on; nothing was written.
        psycopg.Error: the database failed; nothing was written.
        psycopg_pool.PoolTimeout: no connection within ``timeout_s``.
    """
    checker: Stores[Any] = POSTGRES if stores is None else stores
    with pool.connection(timeout=timeout_s) as conn, conn.transaction():
        checker.check(conn, fence)
        return work(conn)


class CommitPoint:
    """Commits a consumer's offsets, only after the database commit (module docstring).

    Args:
        consumer: the group member whose offsets are committed.
        consequence: what a refused commit means, for the log line (e.g. "records
            will be redelivered").
        counted: count refused commits in ``invoicing_offset_commit_failures_total``
            (False for commits that only record progress).
        wait_s: the longest a synchronous commit is waited for (seconds; module
            docstring); None (the default) waits as long as librdkafka does.
    """

    def __init__(
        self,
        consumer: KafkaSource,
        *,
        consequence: str = "after the database commit: records will be redelivered",
        counted: bool = True,
        wait_s: float | None = None,
    ) -> None:
        self.consumer = consumer
        self._consequence = consequence
        self._counted = counted
        self._wait_s = wait_s
        #: a synchronous commit still waiting after ``wait_s`` (set when it ends)
        self._waiting: threading.Event | None = None

    def commit(self, offsets: Sequence[TopicPartition], *, asynchronous: bool = False) -> bool:
        """Step 2, only after step 1 committed: commit ``offsets`` (next offsets to read).

        Synchronous unless ``asynchronous`` (then only a local refusal is seen).
        Returns False (logged, counted unless ``counted`` is False) when refused; never
        raises for a refusal.
        """
        if not offsets:
            return True
        try:
            if asynchronous:
                self.consumer.commit(offsets=list(offsets), asynchronous=True)
            elif self._wait_s is None:
                self.consumer.commit(offsets=list(offsets), asynchronous=False)
            else:
                return self._commit_waiting_at_most(offsets, self._wait_s)
        except KafkaException as exc:
            self._refused(offsets, str(exc.args[0] if exc.args else exc))
            return False
        return True

    def _commit_waiting_at_most(self, offsets: Sequence[TopicPartition], wait_s: float) -> bool:
        """A synchronous commit on a thread of its own, waited for at most ``wait_s``.

        Raises:
            KafkaException: the commit was refused within ``wait_s``.
        """
        if self._waiting is not None and not self._waiting.is_set():
            self._refused(offsets, "an earlier offset commit is still waiting for the coordinator")
            return False
        done = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self.consumer.commit(offsets=list(offsets), asynchronous=False)
            except BaseException as exc:  # handed to the caller's thread below
                failure.append(exc)
            finally:
                done.set()

        # a daemon: a commit that never returns must not hold the process's exit
        threading.Thread(target=run, name="offset-commit", daemon=True).start()
        if not done.wait(wait_s):
            self._waiting = done
            self._refused(
                offsets,
                f"not answered within {wait_s:g} s (is the group coordinator reachable?); "
                "it goes on waiting, and the poll loop goes on",
            )
            return False
        if failure:
            raise failure[0]
        return True

    def _refused(self, offsets: Sequence[TopicPartition], why: str) -> None:
        if self._counted:
            OFFSET_COMMIT_FAILURES.inc()
        log.warning(
            "offset commit of %s failed (%s): %s",
            ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in offsets),
            self._consequence,
            why,
        )

    def write_then_commit(
        self, write: Callable[[], T], offsets: Sequence[TopicPartition]
    ) -> tuple[T, bool]:
        """The whole order for a synchronous writer: ``write()`` (which must have
        committed to the database when it returns), then :meth:`commit` of ``offsets``.
        Returns ``write``'s result and whether the offsets were committed.

        Raises:
            whatever ``write`` raises; then nothing is committed to Kafka.
        """
        result = write()
        return result, self.commit(offsets)
