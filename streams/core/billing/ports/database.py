"""The database port: a pool that hands out connections (psycopg's pool or the twin)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, TypeVar


class Connection(Protocol):
    """What the kernel's writers need of a store connection besides the stores:
    ``with conn.transaction():`` (a transaction, or a savepoint inside one; see
    :class:`Database`). ``psycopg.Connection`` has it; so has the twin's connection."""

    def transaction(self) -> AbstractContextManager[object]:
        """Begin a transaction (a savepoint inside an open one), committed when the block
        ends, rolled back when it raises."""
        ...


#: The connection type a :class:`Database` hands out.
C_co = TypeVar("C_co", covariant=True)


class Database(Protocol[C_co]):
    """Where store connections come from: ``with database.connection() as conn:``.

    The connection is not in autocommit mode: the first statement (or
    ``conn.transaction()``) begins a transaction; leaving the block commits it, or
    rolls it back when the block raises. ``conn.transaction()`` inside an open
    transaction is a savepoint (rolled back alone when its block raises). This is
    ``psycopg_pool.ConnectionPool`` with ``autocommit=False`` connections (what
    :func:`streams.bootstrap.postgres_pool` builds); the twin is
    :class:`streams.adapters.memory.database.InMemoryDatabase`.

    Raises (from the block's statements): ``psycopg.Error`` — ``psycopg.OperationalError``
    when the database cannot be used (the twin raises it for an injected failure too).
    """

    def connection(self, timeout: float | None = None) -> AbstractContextManager[C_co]:
        """A connection for the length of the ``with`` block (see the class docstring),
        waiting at most ``timeout`` seconds for one (None: the database's default).

        Raises:
            psycopg_pool.PoolTimeout: no connection within ``timeout``.
        """
        ...
