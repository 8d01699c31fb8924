"""Example subscriber: a ledger of invoice totals, fed by ``billing.invoices.v1``.

Written the way a team outside billing would write it: it depends only on the
published contracts (the JSON Schema files in ``schemas/billing.invoices.v1/``,
see docs/subscribing.md) and on confluent-kafka, psycopg and jsonschema. It
imports nothing from the pipeline's ``streams`` package: a subscriber in another
team would not have it, and the example proves the published contracts suffice.

What it keeps, in its own PostgreSQL schema ``ledger`` (created on start):

- ``ledger.inbox(event_id PRIMARY KEY, topic, partition, "offset", event_type,
  document_type, document_id, outcome, detail, processed_at)``: one row per event id
  (the ``ce_id`` header) it has processed;
- ``ledger.entries``: one signed amount per document, ``UNIQUE (document_type,
  document_id)``;
- ``ledger.balances(customer_id, billing_period, currency) → balance``: the sum of
  the entries, maintained in the same transaction.

Semantics (amounts: exact decimals in the currency's units, from decimal strings):
``invoice.issued`` adds the invoice ``total``; ``credit_note.issued`` subtracts the
credited ``total``; ``invoice.voided`` subtracts what is still open on the voided
invoice (its total minus its credit notes). So the balance of a (customer, period)
equals the total of its current issued revision, or zero when none is.

Delivery is at least once, so:

1. the inbox row and the ledger effect are written in ONE transaction, and a
   ``ce_id`` already in the inbox makes the record a no-op (redelivery);
2. the same document republished under a new ``ce_id`` (the pipeline's
   reconciliation does that) finds its entry by (document type, document id) and
   changes nothing (inbox outcome ``duplicate_document``);
3. Kafka offsets are committed only after the database commit. A crash between
   the two redelivers records that step 1 absorbs.

Records it cannot use never stop it: an unknown event type (the topic may gain
types) is recorded ``ignored``; a record that breaks the contract is recorded
``invalid`` with the reason, logged, and skipped (look at ``ledger.inbox``).
Validation is tolerant of what the compatibility policy lets the producer add
within v1: ``additionalProperties: false`` is dropped from the schemas (new
optional fields) and so is the ``ce_type`` enum of the headers (new event types).

Run (from the repository root)::

    python -m examples.ledger --until-caught-up
    python examples/ledger/ledger.py --group ledger --dsn "host=... dbname=..."

Exit codes: 0 done (caught up, or stopped by SIGINT/SIGTERM), 1 a database or
Kafka error (offsets not committed past what was stored), 2 bad arguments or
schemas not found, 3 ``--max-seconds`` elapsed before catching up.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

logger = logging.getLogger("ledger")

#: The contract this subscriber is written against (folder under the schemas root).
CONTRACT = "billing.invoices.v1"
DEFAULT_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
DEFAULT_DSN = "host=127.0.0.1 port=15432 dbname=invoicing user=invoicing password=invoicing"

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS ledger;
CREATE TABLE IF NOT EXISTS ledger.inbox (
    event_id        text PRIMARY KEY,
    topic           text NOT NULL,
    partition       integer NOT NULL,
    "offset"        bigint NOT NULL,
    event_type      text,
    document_type   text,
    document_id     text,
    outcome         text NOT NULL
        CHECK (outcome IN ('applied', 'duplicate_document', 'ignored', 'invalid')),
    detail          text,
    processed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger.entries (
    entry_id        bigserial PRIMARY KEY,
    event_id        text NOT NULL UNIQUE REFERENCES ledger.inbox (event_id),
    document_type   text NOT NULL CHECK (document_type IN ('invoice', 'credit_note', 'void')),
    document_id     text NOT NULL,
    invoice_id      text NOT NULL,
    customer_id     text NOT NULL,
    billing_period  text NOT NULL,
    currency        text NOT NULL,
    amount          numeric NOT NULL,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (document_type, document_id)
);
CREATE INDEX IF NOT EXISTS entries_invoice ON ledger.entries (invoice_id);
CREATE TABLE IF NOT EXISTS ledger.balances (
    customer_id     text NOT NULL,
    billing_period  text NOT NULL,
    currency        text NOT NULL,
    balance         numeric NOT NULL,
    entries         integer NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, billing_period, currency)
);
"""


class LedgerError(Exception):
    """Root of the ledger's errors."""


class ContractMissing(LedgerError):
    """The published schemas were not found or do not parse (a setup error)."""


class InvalidRecord(LedgerError):
    """A record that breaks the contract (permanent: recorded ``invalid``, skipped)."""


@dataclass(frozen=True)
class Config:
    """Command-line options. ``max_seconds`` None = no limit."""

    bootstrap_servers: str = "127.0.0.1:19092"
    topic: str = CONTRACT
    group_id: str = "ledger"
    dsn: str = DEFAULT_DSN
    schemas: Path = DEFAULT_SCHEMAS
    until_caught_up: bool = False
    max_seconds: float | None = None
    batch_size: int = 200


# --------------------------------------------------------------------------- contract


def _relax(schema: Any) -> Any:
    """``schema`` without ``additionalProperties: false`` anywhere (tolerant reader)."""
    if isinstance(schema, dict):
        return {
            k: _relax(v)
            for k, v in schema.items()
            if not (k == "additionalProperties" and v is False)
        }
    if isinstance(schema, list):
        return [_relax(v) for v in schema]
    return schema


@dataclass
class Contract:
    """Validators for the headers and the value of each event type of the topic."""

    headers: Draft202012Validator
    values: dict[str, Draft202012Validator]

    @classmethod
    def load(cls, root: Path) -> Contract:
        """Read ``<root>/billing.invoices.v1/*.schema.json``.

        Raises:
            ContractMissing: the folder, the headers schema or every value schema is missing,
                or a file is not a valid JSON Schema.
        """
        folder = root / CONTRACT
        try:
            # New event types may be added within v1: accept any ce_type here, and
            # skip the types without a value schema ("ignored").
            headers = cls._validator(folder / "headers.schema.json", open_types=True)
            values = {
                path.name.removesuffix(".schema.json"): cls._validator(path)
                for path in sorted(folder.glob("*.schema.json"))
                if path.name not in ("headers.schema.json", "key.schema.json")
            }
        except (OSError, ValueError) as exc:
            raise ContractMissing(
                f"cannot load the {CONTRACT} schemas from {folder}: {exc}"
            ) from exc
        if not values:
            raise ContractMissing(f"no value schemas in {folder}")
        return cls(headers, values)

    @staticmethod
    def _validator(path: Path, *, open_types: bool = False) -> Draft202012Validator:
        schema = _relax(json.loads(path.read_text(encoding="utf-8")))
        if open_types:
            schema.get("properties", {}).get("ce_type", {}).pop("enum", None)
        Draft202012Validator.check_schema(schema)
        return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


# --------------------------------------------------------------------------- one record


@dataclass(frozen=True)
class Effect:
    """What one event does to the ledger. ``amount`` None = computed in the database
    (a void reverses what is open on the invoice)."""

    document_type: str
    document_id: str
    invoice_id: str
    customer_id: str
    billing_period: str
    currency: str | None
    amount: Decimal | None
    occurred_at: str


def _decimal(value: Any, what: str) -> Decimal:
    try:
        return Decimal(str(value))
    except InvalidOperation:
        raise InvalidRecord(f"{what} {value!r} is not a decimal") from None


def effect_of(event_type: str, data: Mapping[str, Any]) -> Effect | None:
    """The ledger effect of a validated event's data; None for a type it does not handle."""
    if event_type == "invoice.issued":
        return Effect(
            "invoice",
            data["invoice_id"],
            data["invoice_id"],
            data["customer_id"],
            data["billing_period"],
            data["currency"],
            _decimal(data["total"], "total"),
            data["issued_at"],
        )
    if event_type == "credit_note.issued":
        return Effect(
            "credit_note",
            data["credit_note_id"],
            data["invoice_id"],
            data["customer_id"],
            data["billing_period"],
            data["currency"],
            -_decimal(data["total"], "total"),
            data["issued_at"],
        )
    if event_type == "invoice.voided":
        return Effect(
            "void",
            data["invoice_id"],
            data["invoice_id"],
            data["customer_id"],
            data["billing_period"],
            None,
            None,
            data["voided_at"],
        )
    return None


def decode(message: Message, contract: Contract) -> tuple[str, str, dict[str, Any]]:
    """``(event_id, event_type, data)`` of a record, checked against the contract.

    Raises:
        InvalidRecord: headers or value do not satisfy the published schemas, or the
            key differs from ``ce_subject``.
    """
    raw_headers = message.headers() or []
    pairs = list(raw_headers.items()) if isinstance(raw_headers, dict) else list(raw_headers)
    headers: dict[str, str] = {}
    for name, raw in pairs:  # the last of repeated names wins
        if isinstance(raw, bytes):
            headers[name] = raw.decode("utf-8", errors="replace")
        elif raw is not None:
            headers[name] = raw
    try:
        contract.headers.validate(headers)
    except ValidationError as exc:
        raise InvalidRecord(f"headers: {exc.message}") from None
    key = message.key()
    if key is None or key.decode("utf-8", errors="replace") != headers["ce_subject"]:
        raise InvalidRecord("record key differs from ce_subject")
    event_type = headers["ce_type"]
    validator = contract.values.get(event_type)
    if validator is None:
        return headers["ce_id"], event_type, {}
    try:
        data = json.loads(message.value() or b"")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRecord(f"value is not JSON: {exc}") from None
    try:
        validator.validate(data)
    except ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidRecord(f"{event_type} {where}: {exc.message}") from None
    if data.get("customer_id") != headers["ce_subject"]:
        raise InvalidRecord("data.customer_id differs from ce_subject")
    return headers["ce_id"], event_type, data


def _coordinates(message: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (always set for those)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None or partition is None or offset is None:
        raise InvalidRecord("record without topic, partition or offset")
    return topic, partition, offset


def apply(conn: psycopg.Connection[Any], message: Message, contract: Contract) -> str:
    """Process one record in one transaction; returns its outcome: ``applied``,
    ``duplicate_event`` (ce_id already in the inbox: nothing written),
    ``duplicate_document``, ``ignored`` or ``invalid``.

    Raises:
        psycopg.Error: the database failed (transient: nothing was written).
    """
    topic, partition, offset = _coordinates(message)
    try:
        event_id, event_type, data = decode(message, contract)
        effect = effect_of(event_type, data) if data else None
        problem = None
    except InvalidRecord as exc:
        # Without a valid ce_id there is nothing to deduplicate on: key by coordinates.
        event_id, event_type, effect, problem = (
            f"{topic}:{partition}:{offset}",
            None,
            None,
            str(exc),
        )
        logger.error("invalid record %s[%s]@%s: %s", topic, partition, offset, exc)
    with conn.transaction():
        outcome = "invalid" if problem else ("ignored" if effect is None else "applied")
        row = conn.execute(
            """
            INSERT INTO ledger.inbox (event_id, topic, partition, "offset", event_type,
                                      document_type, document_id, outcome, detail)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (event_id) DO NOTHING
            RETURNING event_id
            """,
            (
                event_id,
                topic,
                partition,
                offset,
                event_type,
                effect.document_type if effect else None,
                effect.document_id if effect else None,
                outcome,
                problem,
            ),
        ).fetchone()
        if row is None:
            return "duplicate_event"
        if effect is None:
            return outcome
        amount, currency = effect.amount, effect.currency
        if effect.document_type == "void":
            open_row = conn.execute(
                "SELECT currency, sum(amount) FROM ledger.entries WHERE invoice_id = %s "
                "AND document_type <> 'void' GROUP BY currency",
                (effect.invoice_id,),
            ).fetchone()
            if open_row is None:
                conn.execute(
                    "UPDATE ledger.inbox SET outcome = 'ignored', detail = %s WHERE event_id = %s",
                    ("void of an invoice this ledger never saw", event_id),
                )
                return "ignored"
            currency, amount = open_row[0], -Decimal(open_row[1])
        inserted = conn.execute(
            """
            INSERT INTO ledger.entries (event_id, document_type, document_id, invoice_id,
                customer_id, billing_period, currency, amount, occurred_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (document_type, document_id) DO NOTHING
            RETURNING entry_id
            """,
            (
                event_id,
                effect.document_type,
                effect.document_id,
                effect.invoice_id,
                effect.customer_id,
                effect.billing_period,
                currency,
                amount,
                effect.occurred_at,
            ),
        ).fetchone()
        if inserted is None:
            conn.execute(
                "UPDATE ledger.inbox SET outcome = 'duplicate_document' WHERE event_id = %s",
                (event_id,),
            )
            return "duplicate_document"
        conn.execute(
            """
            INSERT INTO ledger.balances (customer_id, billing_period, currency, balance, entries)
            VALUES (%s, %s, %s, %s, 1)
            ON CONFLICT (customer_id, billing_period, currency) DO UPDATE
               SET balance = ledger.balances.balance + EXCLUDED.balance,
                   entries = ledger.balances.entries + 1,
                   updated_at = now()
            """,
            (effect.customer_id, effect.billing_period, currency, amount),
        )
    return "applied"


# --------------------------------------------------------------------------- the loop


@dataclass
class Ledger:
    """The consumer loop: poll a batch, apply each record (one transaction each),
    then commit the batch's offsets (after the database commits)."""

    config: Config
    outcomes: Counter[str] = field(default_factory=Counter)
    _stop: bool = False

    def stop(self, *_: Any) -> None:
        self._stop = True

    def consumer_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.config.bootstrap_servers,
            "group.id": self.config.group_id,
            "client.id": f"ledger-{self.config.group_id}",
            # A new group starts at the beginning (retention is infinite).
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
        }

    def run(self) -> int:
        """Consume until stopped (or caught up with ``until_caught_up``); the exit code."""
        contract = Contract.load(self.config.schemas)
        consumer = Consumer(self.consumer_config())
        started = time.monotonic()
        try:
            with psycopg.connect(self.config.dsn, autocommit=True) as conn:
                conn.execute(SCHEMA_SQL)
                consumer.subscribe([self.config.topic])
                while not self._stop:
                    messages = consumer.consume(self.config.batch_size, timeout=1.0)
                    done: dict[tuple[str, int], int] = {}
                    for message in messages:
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                continue
                            raise KafkaException(error)
                        self.outcomes[apply(conn, message, contract)] += 1
                        topic, partition, offset = _coordinates(message)
                        done[(topic, partition)] = offset
                    if done:
                        # After the database commits: at least once, never lost.
                        consumer.commit(
                            offsets=[TopicPartition(t, p, o + 1) for (t, p), o in done.items()],
                            asynchronous=False,
                        )
                    elif self.config.until_caught_up and _caught_up(consumer):
                        return 0
                    limit = self.config.max_seconds
                    if limit is not None and time.monotonic() - started > limit:
                        logger.error("not caught up after %.0f s", limit)
                        return 3
                return 0
        finally:
            consumer.close()


def _caught_up(consumer: Consumer) -> bool:
    """True when every assigned partition's next offset is at its high watermark."""
    assignment = consumer.assignment()
    if not assignment:
        return False
    committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(assignment, 10)}
    for tp in consumer.position(assignment):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), timeout=10, cached=False
        )
        position = tp.offset
        if position < 0:
            stored = committed.get((tp.topic, tp.partition), -1)
            position = stored if stored >= 0 else low
        if position < high:
            return False
    return True


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """Command-line options → :class:`Config` (exits 2 on bad arguments)."""
    parser = argparse.ArgumentParser(
        prog="ledger", description="Ledger of invoice totals fed by billing.invoices.v1."
    )
    parser.add_argument("--bootstrap", default=Config.bootstrap_servers, help="Kafka brokers.")
    parser.add_argument("--topic", default=Config.topic, help="Topic to consume.")
    parser.add_argument("--group", default=Config.group_id, help="Consumer group (own offsets).")
    parser.add_argument("--dsn", default=Config.dsn, help="PostgreSQL connection string.")
    parser.add_argument(
        "--schemas", type=Path, default=DEFAULT_SCHEMAS, help="Published schemas folder."
    )
    parser.add_argument(
        "--until-caught-up", action="store_true", help="Exit once every partition is read."
    )
    parser.add_argument("--max-seconds", type=float, default=None, help="Give up after this.")
    parser.add_argument("--batch-size", type=int, default=Config.batch_size)
    args = parser.parse_args(argv)
    return Config(
        bootstrap_servers=args.bootstrap,
        topic=args.topic,
        group_id=args.group,
        dsn=args.dsn,
        schemas=args.schemas,
        until_caught_up=args.until_caught_up,
        max_seconds=args.max_seconds,
        batch_size=args.batch_size,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the ledger, print the outcome counts as JSON on stdout."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    ledger = Ledger(parse_args(argv))

    def handle(signum: int, frame: FrameType | None) -> None:
        ledger.stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    try:
        code = ledger.run()
    except ContractMissing as exc:
        logger.error("%s", exc)
        return 2
    except (psycopg.Error, KafkaException) as exc:
        logger.error("stopped: %s", exc)
        code = 1
    print(json.dumps(dict(sorted(ledger.outcomes.items()))), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
