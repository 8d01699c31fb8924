"""The in-memory database of the store twins: tables in dicts, transactions, failures.

:class:`InMemoryDatabase` is the twin of the :class:`~streams.core.billing.ports.Database`
port (a psycopg pool): ``with db.connection() as conn:`` hands out a
:class:`MemoryConnection` on which the twin stores
(:mod:`streams.adapters.memory.store`, :mod:`~streams.adapters.memory.fencing`,
:mod:`~streams.apps.email.twin`) run, the way the PostgreSQL stores run
on a psycopg connection. The semantics kept are the ones the kernel relies on:

* **Transactions as psycopg has them.** The first statement (or ``conn.transaction()``)
  begins a transaction; leaving ``connection()`` commits it, or rolls it back when
  the block raised; ``conn.transaction()`` inside a transaction is a savepoint. A
  rolled-back transaction leaves nothing behind — numbers from
  ``document_counters`` included (gapless numbering) — except what PostgreSQL does
  not roll back either: sequence values (``invoice_holds.hold_id``).
* **Serializable by construction.** One transaction at a time holds the database
  (a lock taken at its first statement, released at its end), so a fence check
  and the writes after it are atomic — what the check's ``FOR SHARE`` row lock
  gives on PostgreSQL (a claim waits for the write in flight) — and a
  ``FOR UPDATE`` row lock is held for the whole transaction. A second transaction
  on another thread waits for the first; one thread opening a second transaction
  while it holds one would wait for itself, so that raises ``RuntimeError``.
* **Errors as psycopg raises them.** A broken unique key or check raises
  ``psycopg.errors.UniqueViolation`` / ``CheckViolation`` / ``ForeignKeyViolation``;
  after an error the transaction is aborted (every later statement raises
  ``psycopg.errors.InFailedSqlTransaction``) until it is rolled back.
* **Failures on demand.** :meth:`InMemoryDatabase.fail_next` makes the next
  statements (optionally only those of one store function, e.g.
  ``"usage.insert_usage"``) raise ``psycopg.OperationalError``; ``down = True``
  makes every statement raise it (the database cannot be reached).

Tables are ``dict``\\s of frozen rows (:class:`~dataclasses.dataclass` instances,
replaced on update, never mutated), so a transaction's working copy is a shallow
copy of each table it touches. ``now()`` is the transaction's start time from the
database's ``clock`` (UTC), as in PostgreSQL.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

__all__ = ["InMemoryDatabase", "MemoryConnection", "Statement"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Failure:
    statement: str | None
    error: BaseException


@dataclass
class _Transaction:
    """One open transaction: its working copy of the tables it touched, its start time."""

    now: datetime
    working: dict[str, dict[Any, Any]] = field(default_factory=dict)
    aborted: BaseException | None = None


class InMemoryDatabase:
    """The :class:`~streams.core.billing.ports.Database` twin (module docstring). Thread-safe.

    Args:
        clock: the current time, UTC-aware (``now()`` of a transaction is its value at
            the transaction's first statement). Default: the wall clock.
        lock_timeout_s: longest wait for the database held by another transaction
            before a statement raises ``psycopg.errors.LockNotAvailable`` (SQLSTATE
            55P03); None waits for ever. A store may give its own (the delivery store's
            ``lock_timeout_s``).

    Attributes:
        down: when true, every statement raises ``psycopg.OperationalError``.
        commits: the number of transactions committed (tests wait on it).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] = _utcnow,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.clock = clock
        self.lock_timeout_s = lock_timeout_s
        self.down = False
        self.commits = 0
        self._tables: dict[str, dict[Any, Any]] = {}
        self._sequences: dict[str, Iterator[int]] = {}
        self._lock = threading.Lock()  # held by the open transaction
        self._meta = threading.Lock()  # guards failures and sequences
        self._owner: int | None = None
        self._failures: list[_Failure] = []

    # ------------------------------------------------------------------ the port

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[MemoryConnection]:
        """A connection for the block: its open transaction is committed when the block
        ends normally and rolled back when it raises (as a psycopg pool's connection).
        ``timeout`` is accepted for the port and ignored: the twin never waits."""
        conn = MemoryConnection(self)
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()

    # ------------------------------------------------------------------ test hooks

    def fail_next(
        self, count: int = 1, *, statement: str | None = None, error: BaseException | None = None
    ) -> None:
        """Make the next ``count`` statements raise ``error`` (default
        ``psycopg.OperationalError``, as a lost connection does). ``statement`` restricts
        it to one store function (``"<store>.<function>"``, e.g. ``"invoices.insert_invoice"``,
        ``"fences.check"``, ``"deliveries.claim"``)."""
        with self._meta:
            for _ in range(count):
                self._failures.append(
                    _Failure(
                        statement,
                        error
                        or psycopg.OperationalError(
                            f"injected failure ({statement or 'any statement'})"
                        ),
                    )
                )

    def table(self, name: str) -> dict[Any, Any]:
        """A copy of the committed rows of table ``name`` (key → row), for assertions."""
        with self._hold(None):
            return dict(self._tables.get(name, {}))

    def next_value(self, sequence: str) -> int:
        """The next value of ``sequence`` (1, 2, …), never given back by a rollback."""
        with self._meta:
            counter = self._sequences.setdefault(sequence, itertools.count(1))
            return next(counter)

    # ------------------------------------------------------------------ internals

    def _take_failure(self, statement: str) -> BaseException | None:
        with self._meta:
            for i, failure in enumerate(self._failures):
                if failure.statement is None or failure.statement == statement:
                    del self._failures[i]
                    return failure.error
        return None

    @contextmanager
    def _hold(self, timeout_s: float | None) -> Iterator[None]:
        self._acquire(timeout_s)
        try:
            yield
        finally:
            self._release()

    def _acquire(self, timeout_s: float | None) -> None:
        me = threading.get_ident()
        if self._owner == me:
            raise RuntimeError(
                "this thread already has a transaction open on the in-memory database: "
                "a second connection would wait for itself (finish the first transaction)"
            )
        if timeout_s is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=timeout_s):
            raise psycopg.errors.LockNotAvailable(
                f"canceling statement due to lock timeout ({timeout_s:g} s)"
            )
        self._owner = me

    def _release(self) -> None:
        self._owner = None
        self._lock.release()

    def _begin(self, timeout_s: float | None) -> _Transaction:
        self._acquire(self.lock_timeout_s if timeout_s is None else timeout_s)
        return _Transaction(now=self.clock())

    def _working(self, tx: _Transaction, name: str) -> dict[Any, Any]:
        table = tx.working.get(name)
        if table is None:
            table = tx.working[name] = dict(self._tables.get(name, {}))
        return table

    def _commit(self, tx: _Transaction) -> None:
        try:
            if tx.aborted is None:
                self._tables.update(tx.working)
                self.commits += 1
        finally:
            self._release()

    def _rollback(self, tx: _Transaction) -> None:
        self._release()


class Statement:
    """One statement of a store function on an open transaction (from
    :meth:`MemoryConnection.statement`): table access, ``now()``, and errors that
    abort the transaction."""

    def __init__(self, db: InMemoryDatabase, tx: _Transaction) -> None:
        self._db = db
        self._tx = tx

    @property
    def now(self) -> datetime:
        """``now()``: the transaction's start time (UTC)."""
        return self._tx.now

    def table(self, name: str) -> dict[Any, Any]:
        """The transaction's working copy of table ``name`` (key → frozen row); write
        to it by assigning or deleting keys."""
        return self._db._working(self._tx, name)

    def next_value(self, sequence: str) -> int:
        """``nextval(sequence)``: not given back by a rollback."""
        return self._db.next_value(sequence)

    def inserted_here(self, name: str, key: Any) -> bool:
        """Whether row ``key`` of table ``name`` was inserted by this transaction (it is in
        the working copy and not in the committed table): PostgreSQL's "xmin is a
        transaction in progress" test of the guard triggers."""
        return key in self.table(name) and key not in self._db._tables.get(name, {})

    def insufficient_privilege(self, message: str) -> BaseException:
        """Abort with ``psycopg.errors.InsufficientPrivilege`` (SQLSTATE 42501)."""
        return self.fail(psycopg.errors.InsufficientPrivilege(message))

    def fail(self, error: BaseException) -> BaseException:
        """Abort the transaction with ``error`` and return it (``raise stmt.fail(...)``)."""
        self._tx.aborted = error
        return error

    def unique_violation(self, constraint: str, detail: str) -> BaseException:
        """Abort with ``psycopg.errors.UniqueViolation`` (SQLSTATE 23505)."""
        return self.fail(
            psycopg.errors.UniqueViolation(
                f'duplicate key value violates unique constraint "{constraint}"\nDETAIL: {detail}'
            )
        )

    def check_violation(self, constraint: str, detail: str) -> BaseException:
        """Abort with ``psycopg.errors.CheckViolation`` (SQLSTATE 23514)."""
        return self.fail(
            psycopg.errors.CheckViolation(
                f'new row violates check constraint "{constraint}"\nDETAIL: {detail}'
            )
        )

    def foreign_key_violation(self, constraint: str, detail: str) -> BaseException:
        """Abort with ``psycopg.errors.ForeignKeyViolation`` (SQLSTATE 23503)."""
        return self.fail(
            psycopg.errors.ForeignKeyViolation(
                f'insert or update violates foreign key constraint "{constraint}"\nDETAIL: {detail}'
            )
        )


class MemoryConnection:
    """A connection of :class:`InMemoryDatabase` (not thread-safe, like a psycopg
    connection: one thread uses it at a time)."""

    def __init__(self, db: InMemoryDatabase) -> None:
        self.db = db
        self._tx: _Transaction | None = None

    @property
    def in_transaction(self) -> bool:
        return self._tx is not None

    @contextmanager
    def transaction(self) -> Iterator[MemoryConnection]:
        """``BEGIN`` … ``COMMIT`` (``ROLLBACK`` when the block raises); a savepoint when
        a transaction is open already (only the block's changes are rolled back)."""
        if self._tx is None:
            self._tx = self.db._begin(None)
            try:
                yield self
            except BaseException:
                self.rollback()
                raise
            else:
                self.commit()
            return
        tx = self._tx
        saved = {name: dict(table) for name, table in tx.working.items()}
        aborted = tx.aborted
        try:
            yield self
        except BaseException:
            tx.working = saved
            tx.aborted = aborted
            raise

    @contextmanager
    def statement(self, name: str, *, lock_timeout_s: float | None = None) -> Iterator[Statement]:
        """Run one statement of store function ``name`` (``"<store>.<function>"``): begin
        the transaction if none is open (waiting up to ``lock_timeout_s``, default the
        database's), refuse it if the transaction is aborted, apply injected failures,
        and abort the transaction if the statement raises.

        Raises:
            psycopg.OperationalError: the database is ``down`` or a failure was injected.
            psycopg.errors.InFailedSqlTransaction: an earlier statement failed.
            psycopg.errors.LockNotAvailable: the lock timeout passed.
        """
        db = self.db
        if db.down:
            raise psycopg.OperationalError("connection refused: the in-memory database is down")
        if self._tx is None:
            self._tx = db._begin(lock_timeout_s)
        tx = self._tx
        if tx.aborted is not None:
            raise psycopg.errors.InFailedSqlTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        injected = db._take_failure(name)
        if injected is not None:
            tx.aborted = injected
            raise injected
        try:
            yield Statement(db, tx)
        except BaseException as exc:
            if isinstance(exc, psycopg.Error) and tx.aborted is None:
                tx.aborted = exc
            raise

    def commit(self) -> None:
        """Commit the open transaction (an aborted one is rolled back), if any."""
        tx, self._tx = self._tx, None
        if tx is not None:
            self.db._commit(tx)

    def rollback(self) -> None:
        """Roll the open transaction back, if any."""
        tx, self._tx = self._tx, None
        if tx is not None:
            self.db._rollback(tx)
