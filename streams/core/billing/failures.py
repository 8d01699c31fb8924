"""The one place that says what a failure means: retry it, or deal with it once.

Every consumer of the pipeline's topics asks :func:`classify` what to do with an exception: the
invoicing worker's batch writes and invoice jobs, the email sender, ``close-period``'s topic scan
and the replay's re-read and corrections (docs/design.md, invariant 5;
docs/decisions/0009-one-failure-table.md). The answer is a :class:`Failure` with one of five
dispositions:

=================  ================================================================
``TRANSIENT``      the world is not ready (the database, the broker, Redis, the tax
                   service or SMTP unreachable, a lock or serialization conflict, a
                   timeout): retry with backoff; the same input will succeed later.
``PERMANENT``      the *input* can never be processed (a record that does not decode,
                   a value PostgreSQL refuses, an arithmetic failure on its numbers, a
                   refusal by a rule): deal with it **once** — dead-letter the record
                   with this reason and hold its customer, or record the refusal — and
                   move on; retrying fails the same way.
``CONTENDED``      another writer owns this piece of work right now (the tax service
                   holds a document committed under the same idempotency key by a
                   concurrent writer): wait for it, then look at what it wrote.
``FENCED``         this writer's ownership ended (a partition fence or lease fence
                   moved on, a lease was lost): drop the work, never retry it here,
                   never dead-letter it — the new owner does it.
``UNEXPECTED``     a bug or a deployment problem (an undefined table or column, a
                   missing grant, an internal error, an exception nobody named):
                   retry with backoff and alert. Never dead-lettered: dead-lettering
                   good records because of our own bug would divert billing data.
=================  ================================================================

The table (first match wins), with the reasons that decide it:

================================================  ===========  ================================
failure                                           disposition  why
================================================  ===========  ================================
``Fenced``, ``LeaseFenced``, ``LeaseLost``        FENCED       ownership ended
``TaxRejected`` with HTTP 409                     CONTENDED    the key's document is another's
:class:`TransientError` (e.g. email errors)       TRANSIENT    declared by its package
:class:`PermanentError` (e.g. email errors)       PERMANENT    declared by its package
``DomainError`` (``InvalidEvent``, rules, …)      PERMANENT    the domain refused the input
``decimal.DecimalException``, ``ArithmeticError``  PERMANENT    arithmetic on the input's numbers
``UnicodeError``, ``RecursionError``              PERMANENT    text or nesting no reader holds
pydantic ``ValidationError``                      PERMANENT    data that makes no valid event
``TaxRejected`` (other 4xx, invalid answer)       PERMANENT    the same document fails again
``TaxUnavailable``                                TRANSIENT    retries exhausted for now
``DeadLetterError``                               TRANSIENT    the dead-letter topic is away
``LeaseUnavailable``, ``LeaseStoreError``,        TRANSIENT    Redis or the fence table away
``LeaseBusy``
``psycopg_pool.PoolTimeout``                      TRANSIENT    no connection within the bound
psycopg, SQLSTATE class 08, 40, 53, 57, 58,       TRANSIENT    connection, rollback, resources,
``55P03``, or no SQLSTATE (connection lost)                    operator intervention, I/O, lock
psycopg ``DataError`` without SQLSTATE            PERMANENT    refused client-side (a NUL byte)
psycopg, SQLSTATE class 22, 23, 54                PERMANENT    data exception, integrity, limits
psycopg, any other SQLSTATE (42, 0A, 25, XX, …)   UNEXPECTED   schema, privileges, internal
``KafkaException`` retriable                      TRANSIENT    librdkafka says so
``redis.RedisError``, ``OSError``,                TRANSIENT    a network or service failure
``TimeoutError``
anything else (``KafkaException`` not retriable,  UNEXPECTED   nobody named it
``MemoryError``, ``TypeError``, …)
================================================  ===========  ================================

**New record types** (R2's ``usage.metered`` and ``subscription.*`` rows) need
nothing here: their decode failures are ``InvalidEvent``, their database
refusals SQLSTATE 22/23/54, their rating failures ``DomainError`` subclasses
(``streams.core.domain.rating`` raises those). A new package with its own exception
tree declares each class transient or permanent by subclassing
:class:`TransientError` or :class:`PermanentError`, as ``streams.apps.email.errors`` does.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from enum import StrEnum

import psycopg
import redis
from confluent_kafka import KafkaError, KafkaException
from psycopg_pool import PoolTimeout
from pydantic import ValidationError

from streams.core.billing.dead_letters import DeadLetterError
from streams.core.billing.fencing import Fenced
from streams.core.billing.lease_errors import (
    LeaseBusy,
    LeaseFenced,
    LeaseLost,
    LeaseStoreError,
    LeaseUnavailable,
)
from streams.core.billing.ports import TaxRejected, TaxUnavailable
from streams.core.domain.errors import DomainError
from streams.errors import InvoicingError

__all__ = [
    "Disposition",
    "Failure",
    "PermanentError",
    "TransientError",
    "classify",
]


class Disposition(StrEnum):
    """What to do with a failure (module docstring)."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    CONTENDED = "contended"
    FENCED = "fenced"
    UNEXPECTED = "unexpected"


class TransientError(InvoicingError):
    """Base for a package's exceptions that :func:`classify` calls transient."""


class PermanentError(InvoicingError):
    """Base for a package's exceptions that :func:`classify` calls permanent."""


@dataclass(frozen=True)
class Failure:
    """A classified failure: what to do (``disposition``), and a ``reason`` fit for a
    dead letter, a hold or a log line (the exception's type and message, with the
    SQLSTATE or Kafka error name when there is one; at most 2,000 characters)."""

    disposition: Disposition
    reason: str
    sqlstate: str | None = None

    @property
    def retry(self) -> bool:
        """Retry later (transient, contended or unexpected); not for fenced work."""
        return self.disposition in (
            Disposition.TRANSIENT,
            Disposition.CONTENDED,
            Disposition.UNEXPECTED,
        )

    @property
    def permanent(self) -> bool:
        return self.disposition is Disposition.PERMANENT


#: SQLSTATE classes of failures that pass: connection exception, transaction rollback
#: (serialization failure, deadlock), insufficient resources, operator intervention
#: (admin shutdown, statement timeout, cannot connect now), system error.
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
#: SQLSTATEs outside those classes that pass as well: lock not available.
_TRANSIENT_SQLSTATES = frozenset({"55P03"})
#: SQLSTATE classes of failures caused by the data: data exception (a NUL in text,
#: a number out of range), integrity constraint violation, program limit exceeded
#: (an index row too large).
_PERMANENT_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})

_MAX_REASON = 2000


def _reason(exc: BaseException, extra: str = "") -> str:
    text = f"{type(exc).__name__}{extra}: {exc}"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def classify(exc: BaseException) -> Failure:
    """What ``exc`` means (the table of the module docstring). Never raises."""
    if isinstance(exc, Fenced | LeaseFenced | LeaseLost):
        return Failure(Disposition.FENCED, _reason(exc))
    if isinstance(exc, TaxRejected) and exc.status == 409:
        return Failure(Disposition.CONTENDED, _reason(exc, " (HTTP 409)"))
    if isinstance(exc, TransientError):
        return Failure(Disposition.TRANSIENT, _reason(exc))
    if isinstance(exc, PermanentError | DomainError):
        return Failure(Disposition.PERMANENT, _reason(exc))
    if isinstance(exc, decimal.DecimalException | ArithmeticError):
        return Failure(Disposition.PERMANENT, _reason(exc, " (arithmetic on the input)"))
    if isinstance(exc, UnicodeError | RecursionError | ValidationError):
        return Failure(Disposition.PERMANENT, _reason(exc))
    if isinstance(exc, TaxRejected):
        return Failure(Disposition.PERMANENT, _reason(exc, f" (HTTP {exc.status})"))
    if isinstance(
        exc,
        TaxUnavailable
        | DeadLetterError
        | LeaseUnavailable
        | LeaseStoreError
        | LeaseBusy
        | PoolTimeout,
    ):
        return Failure(Disposition.TRANSIENT, _reason(exc))
    if isinstance(exc, psycopg.Error):
        return _classify_psycopg(exc)
    if isinstance(exc, KafkaException):
        return _classify_kafka(exc)
    if isinstance(exc, redis.RedisError | OSError | TimeoutError):
        return Failure(Disposition.TRANSIENT, _reason(exc))
    return Failure(Disposition.UNEXPECTED, _reason(exc))


def _classify_psycopg(exc: psycopg.Error) -> Failure:
    state = exc.sqlstate
    if state is None:
        if isinstance(exc, psycopg.DataError):  # refused by psycopg before sending
            return Failure(Disposition.PERMANENT, _reason(exc))
        # connection lost, pool closed, no server: psycopg raises without a SQLSTATE
        return Failure(Disposition.TRANSIENT, _reason(exc))
    noted = _reason(exc, f" (SQLSTATE {state})")
    if state[:2] in _TRANSIENT_SQLSTATE_CLASSES or state in _TRANSIENT_SQLSTATES:
        return Failure(Disposition.TRANSIENT, noted, state)
    if state[:2] in _PERMANENT_SQLSTATE_CLASSES:
        return Failure(Disposition.PERMANENT, noted, state)
    return Failure(Disposition.UNEXPECTED, noted, state)


def _classify_kafka(exc: KafkaException) -> Failure:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        noted = _reason(exc, f" ({error.name()})")
        if error.retriable() and not error.fatal():
            return Failure(Disposition.TRANSIENT, noted)
        return Failure(Disposition.UNEXPECTED, noted)
    return Failure(Disposition.UNEXPECTED, _reason(exc))
