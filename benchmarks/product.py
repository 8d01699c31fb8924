"""The harness's only door into the product: every ``streams`` import is in this module.

Issue 9 is rewiring the middle of the code (a billing kernel, entrypoints in one
package, the sandbox in a package); when a name below moves, repoint it here and
nothing else in ``benchmarks/`` changes. What the harness uses:

- the sandbox (:func:`sandbox`: own database, topics, connector, SMTP sink and
  fake tax service per run) and its worker processes (``invoicing worker …``);
- the ``invoicing`` command (:func:`invoicing_command`): import, close-period,
  replay, db migrate run as the operator runs them;
- the project's Kafka client configurations (so the bare baselines use the same
  producer/consumer settings as the product);
- the event codec, to generate load in the product's wire format;
- the issuance transaction (:func:`issue_invoice`), for the fencing micro-benchmark:
  today's ``streams.invoicing.store`` / ``fencing`` functions, called in the order
  ``streams.invoicing.jobs`` calls them in its write phase.
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
from typing import Any

import psycopg

from streams.adapters.kafka import consumer_config, producer_config
from streams.adapters.tax import InMemoryTaxService
from streams.domain.codec import encode
from streams.domain.events import (
    CustomerUpserted,
    Envelope,
    UsageRecorded,
    deterministic_id,
    invoice_id_for,
)
from streams.domain.invoice import UsageLine, apply_tax, price_invoice
from streams.invoicing import fencing, jobs, store
from streams.sandbox import Pipeline, isolated_pipeline
from streams.settings import Settings

__all__ = [
    "FencingFixture",
    "Pipeline",
    "Settings",
    "customer_record",
    "invoicing_command",
    "issue_invoice",
    "kafka_consumer_config",
    "kafka_producer_config",
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
    """The project's isolated pipeline (``streams.sandbox.isolated_pipeline``)."""
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
    drafts: list[store.InvoiceDraft]
    invoices_topic: str


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
        customer = store.Customer(customer_id, f"Customer {c}", f"{customer_id}@x.invalid", "USD")
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
            idempotency_key=f"{invoice_id}:r1",
            customer_id=customer_id,
            currency="USD",
            lines=[line.tax_line() for line in priced.lines],
        )
        marker = store.CloseMarker(
            event_id=f"close-{customer_id}",
            customer_id=customer_id,
            billing_period=period,
            reason="bench",
            source=store.SourceCoordinates("bench.topic", 0, lines),
        )
        drafts.append(
            store.InvoiceDraft(
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
    return FencingFixture(token, drafts, "bench.fencing-outbox")


def issue_invoice(
    conn: psycopg.Connection[Any],
    draft: store.InvoiceDraft,
    token: fencing.FencingToken | None,
    invoices_topic: str,
) -> None:
    """The issuance transaction of ``streams.invoicing.jobs`` (write phase): the fence
    check (skipped when ``token`` is None), a gapless number, the invoice and its
    lines, the outbox row, the close record; one commit.

    Raises:
        fencing.Fenced: the fence no longer holds ``token``.
        RuntimeError: the invoice already existed (the benchmark reused a draft).
    """
    issued_at = datetime.now(UTC)
    period = draft.billing_period
    with conn.transaction():
        if token is not None:
            fencing.check(conn, token)
        number = store.invoice_number(period, store.next_number(conn, f"INV-{period}"))
        inserted = store.insert_invoice(
            conn,
            draft,
            number=number,
            fence=(token.group_id, token.generation, token.member_id) if token else None,
            lease_fencing_token=None,
            issued_at=issued_at,
        )
        if not inserted:
            raise RuntimeError(f"invoice {draft.invoice_id} already existed")
        store.insert_outbox(
            conn,
            event_id=deterministic_id("outbox", "invoice.issued", draft.invoice_id),
            topic=invoices_topic,
            customer_id=draft.customer.customer_id,
            event=jobs.invoice_issued(draft, number, issued_at),
            source=jobs.EVENT_SOURCE,
            time=issued_at,
            document_id=draft.invoice_id,
        )
        store.record_close(conn, draft.marker, "invoiced", draft.invoice_id)


def new_unique() -> str:
    """A short unique token for sandbox names."""
    return "b" + uuid.uuid4().hex[:9]
