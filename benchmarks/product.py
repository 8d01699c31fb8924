"""The harness's only door into the product: every ``streams`` import is in this module.

When a name below moves (the code under the harness is rewired now and then),
repoint it here and nothing else in ``benchmarks/`` changes. What the harness uses:

- the sandbox (:func:`sandbox`: own database, topics, connector, SMTP sink and
  fake tax service per run) and its worker processes (``invoicing worker …``);
- the ``invoicing`` command (:func:`invoicing_command`): import, close-period,
  replay, db migrate run as the operator runs them;
- the project's Kafka client configurations (so the bare baselines use the same
  producer/consumer settings as the product);
- the event codec, to generate load in the product's wire format;
- the issuance transaction (:func:`issue_invoice`), for the fencing micro-benchmark:
  the billing kernel's one issuance transaction (``streams.core.billing.issuance.issue``),
  with the worker's partition fence or with a fence that checks nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql

from benchmarks.measure import run_cli
from streams.adapters.kafka import consumer_config, producer_config
from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.invoicing.jobs import EVENT_SOURCE
from streams.core.billing import fencing, rows, store
from streams.core.billing.issuance import NotIssued, issue, tax_idempotency_key
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    UsageRecorded,
    invoice_id_for,
)
from streams.core.domain.invoice import UsageLine, apply_tax, price_invoice
from streams.devtools.sandbox.pipeline import Pipeline, _drop_database, isolated_pipeline
from streams.settings import Settings
from streams.topics import INVOICES

__all__ = [
    "FencingFixture",
    "Pipeline",
    "Settings",
    "customer_record",
    "drop_database",
    "invoicing_command",
    "issue_invoice",
    "kafka_consumer_config",
    "kafka_producer_config",
    "migrated_database",
    "prepare_fencing",
    "sandbox",
    "usage_record",
]

#: A record as produced: key, value, headers.
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


def base_settings() -> Settings:
    """The settings from the environment (``source .ports.env`` first)."""
    return Settings()


@contextlib.contextmanager
def sandbox(settings: Settings, unique: str, workdir: Path) -> Iterator[Pipeline]:
    """The project's isolated pipeline (``streams.devtools.sandbox.isolated_pipeline``)."""
    with isolated_pipeline(settings, unique, workdir) as pipeline:
        yield pipeline


def invoicing_command() -> list[str]:
    """argv prefix of the ``invoicing`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("invoicing")
    if script.exists():
        return [str(script)]
    found = shutil.which("invoicing")
    if found is None:
        raise RuntimeError("the `invoicing` command is not installed in this environment")
    return [found]


def kafka_producer_config(settings: Settings) -> dict[str, Any]:
    """The product's producer configuration (the importer's, ``bootstrap.producer``)."""
    return producer_config(settings.kafka)


def kafka_consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """The product's consumer configuration (the worker's, ``bootstrap.consumer``)."""
    return consumer_config(settings.kafka, group_id, **overrides)


def customer_record(customer_id: str) -> Record:
    """``customer.upserted`` for ``customer_id`` in the product's wire format."""
    envelope = Envelope.wrap(
        CustomerUpserted(
            customer_id=customer_id,
            name=f"Customer {customer_id}",
            email=f"billing+{customer_id}@customers.invalid",
            currency="USD",
        ),
        id=f"cu-{customer_id}",
        source="/benchmarks",
    )
    encoded = encode(envelope)
    return encoded.key, encoded.value, list(encoded.headers)


@dataclass(frozen=True)
class LineTemplate:
    """Descriptive fields of a usage line, taken from a FOCUS sample row."""

    description: str | None
    sku_id: str | None
    region_id: str | None
    unit: str | None
    charge_category: str | None
    provider: str | None


def usage_record(
    customer_id: str, period: str, n: int, amount: Decimal, template: LineTemplate
) -> Record:
    """``usage.recorded`` number ``n`` of ``customer_id`` in ``period`` (wire format)."""
    year, month = (int(x) for x in period.split("-"))
    envelope = Envelope.wrap(
        UsageRecorded(
            customer_id=customer_id,
            billing_period=period,
            amount=amount,
            currency="USD",
            quantity=Decimal(n % 97 + 1),
            unit=template.unit,
            description=template.description,
            sku_id=template.sku_id,
            region_id=template.region_id,
            charge_category=template.charge_category,
            provider=template.provider,
            event_time=datetime(year, month, 1, tzinfo=UTC) + timedelta(minutes=n % 40_000),
        ),
        id=f"u-{customer_id}-{period}-{n}",
        source="/benchmarks",
    )
    encoded = encode(envelope)
    return encoded.key, encoded.value, list(encoded.headers)


# --------------------------------------------------------------------------- fencing adapter


@dataclass(frozen=True)
class FencingFixture:
    """What the issuance micro-benchmark needs: a claimed token and prepared drafts."""

    token: fencing.FencingToken
    drafts: list[rows.InvoiceDraft]
    invoices_topic: str


#: Drop a sandbox database as the provisioner (its sessions ended first).
drop_database = _drop_database


@contextlib.contextmanager
def migrated_database(settings: Settings, suffix: str, cwd: Path) -> Iterator[str]:
    """A database of its own for a micro-benchmark: created by the provisioner and owned
    by the owner (docs/roles.md, as every sandbox), migrated by ``invoicing db migrate``
    (run in ``cwd``), dropped at the end. Yields its name (``inv_<unique>_<suffix>``)."""
    database = f"inv_{new_unique()}_{suffix}"
    with psycopg.connect(settings.postgres.dsn("provisioner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(settings.postgres.owner.user)
            )
        )
    try:
        run_cli(
            [*invoicing_command(), "db", "migrate"],
            {"INVOICING_POSTGRES__DATABASE": database},
            cwd=cwd,
            timeout_s=300,
        )
        yield database
    finally:
        drop_database(settings.postgres, database)


def prepare_fencing(
    conn: psycopg.Connection[Any], *, count: int, lines: int, unique: str
) -> FencingFixture:
    """Claim a fence row and build ``count`` invoice drafts of ``lines`` lines each,
    taxed by the in-memory tax service (no I/O in the timed part)."""
    token = fencing.FencingToken(f"bench-{unique}", "bench.topic", 0, 1, f"member-{unique}")
    fencing.claim(conn, token)
    conn.commit()
    tax = InMemoryTaxService()
    period = "2026-09"
    drafts = []
    for c in range(count):
        customer_id = f"f{unique}-{lines}-{c}"
        customer = rows.Customer(customer_id, f"Customer {c}", f"{customer_id}@x.invalid", "USD")
        usage = [
            UsageLine(
                event_id=f"fe-{customer_id}-{n}",
                customer_id=customer_id,
                billing_period=period,
                amount=Decimal("0.0123456789") * (n + 1),
                currency="USD",
                quantity=Decimal(1),
                unit="Hours",
                description="bench line",
                sku_id="SKU",
                region_id="us-west-2",
                charge_category="Usage",
                event_time=datetime(2026, 9, 2, tzinfo=UTC),
                source_topic="bench.topic",
                source_partition=0,
                source_offset=n,
            )
            for n in range(lines)
        ]
        priced = price_invoice(usage, currency="USD")
        invoice_id = invoice_id_for(customer_id, period, 1)
        taxed = tax.calculate(
            idempotency_key=tax_idempotency_key(invoice_id, 1),
            customer_id=customer_id,
            currency="USD",
            lines=[line.tax_line() for line in priced.lines],
        )
        marker = rows.CloseMarker(
            event_id=f"close-{customer_id}",
            customer_id=customer_id,
            billing_period=period,
            reason="bench",
            source=rows.SourceCoordinates("bench.topic", 0, lines),
        )
        drafts.append(
            rows.InvoiceDraft(
                invoice_id=invoice_id,
                revision=1,
                customer=customer,
                billing_period=period,
                totals=apply_tax(priced, taxed),
                lines=tuple(usage),
                taxed=tuple(taxed),
                marker=marker,
            )
        )
    # an outbox row may route only to an invoices topic (migration 0015): a prefixed one,
    # never created (nothing reads it: the rows only measure the issuance transaction)
    return FencingFixture(token, drafts, INVOICES.with_prefix("bench-fencing-outbox.").name)


class _Unfenced:
    """A fence that checks nothing: the same transaction without the fence check."""

    def check(self, conn: psycopg.Connection[Any]) -> None:
        return None


class _OneConnection:
    """``pool.connection()`` over one open connection, so the micro-benchmark times
    the kernel's issuance on a connection it holds (no pool checkout in the figure)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        yield self._conn


def issue_invoice(
    conn: psycopg.Connection[Any],
    draft: rows.InvoiceDraft,
    token: fencing.Fence | None,
    invoices_topic: str,
) -> None:
    """The billing kernel's issuance transaction (``streams.core.billing.issuance.issue``) as
    the invoice job calls it: the fence check (a fence that checks nothing when ``token``
    is None), a gapless number, the invoice and its lines, the outbox row, the close
    record; one commit.

    Raises:
        fencing.Fenced: the fence no longer holds ``token``.
        RuntimeError: the invoice already existed (the benchmark reused a draft).
    """
    marker = draft.marker
    assert isinstance(marker, rows.CloseMarker)
    result = issue(
        cast(Any, _OneConnection(conn)),
        token if token is not None else _Unfenced(),
        draft,
        invoices_topic=invoices_topic,
        source=EVENT_SOURCE,
        lease_fencing_token=None,
        after=lambda c, issued: store.closes.record_close(c, marker, "invoiced", issued.invoice_id),
    )
    if isinstance(result, NotIssued):
        raise RuntimeError(f"invoice {draft.invoice_id} already existed: {result.reason}")


def new_unique() -> str:
    """A short unique token for sandbox names."""
    return "b" + uuid.uuid4().hex[:9]
