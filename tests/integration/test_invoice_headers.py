"""billing.invoices.v1 carries the CloudEvents attributes as Kafka headers.

The Debezium outbox EventRouter (connectors/outbox-connector.json) places the
outbox columns as headers with the CloudEvents Kafka binding names: ``id`` →
``ce_id``, ``type`` → ``ce_type``, ``ce_time``, ``ce_specversion``, ``ce_source``,
``aggregateid`` → ``ce_subject``, ``content_type`` → ``content-type``, plus
``document_id`` and Debezium's own ``id``. Rows are written the way
streams/apps/invoicing/jobs.py writes them (``store.invoices.insert_outbox``), in a sandbox
with its own database, connector, slot and topic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from streams.apps.invoicing.jobs import EVENT_SOURCE
from streams.core.billing import store
from streams.core.domain.codec import decode, headers_dict
from streams.core.domain.events import (
    CreditNoteIssued,
    EventData,
    InvoiceIssued,
    InvoiceVoided,
    deterministic_id,
    event_models,
    invoice_id_for,
)
from streams.settings import Settings
from streams.topics import INVOICES
from tests.support.kafka import drain, headers_of, text
from tests.support.pipeline import Pipeline, isolated_pipeline

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / INVOICES.name
CUSTOMER = "/subscriptions/64e355d7-997c-491d-b0c1-8414dccfcf42"
PERIOD = "2024-09"
ISSUED_AT = datetime(2024, 10, 1, 0, 0, 5, 123456, tzinfo=UTC)


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def events() -> list[tuple[EventData, str]]:
    """One event of each invoice type with its document id."""
    invoice_id = invoice_id_for(CUSTOMER, PERIOD, 1)
    credit_note_id = deterministic_id("credit_note", invoice_id)
    common: dict[str, Any] = {"customer_id": CUSTOMER, "billing_period": PERIOD}
    issued = InvoiceIssued(
        **common,
        invoice_id=invoice_id,
        invoice_number="INV-2024-09-000001",
        revision=1,
        customer_name="Zenith Eclipse",
        email="billing@customers.invalid",
        currency="USD",
        line_count=2,
        subtotal=Decimal("13.62"),
        tax_total=Decimal("0.72"),
        total=Decimal("14.34"),
        issued_at=ISSUED_AT,
    )
    credited = CreditNoteIssued(
        **common,
        credit_note_id=credit_note_id,
        credit_note_number="CN-2024-09-000001",
        invoice_id=invoice_id,
        invoice_number="INV-2024-09-000001",
        revision=1,
        customer_name="Zenith Eclipse",
        email="billing@customers.invalid",
        currency="USD",
        subtotal=Decimal("13.62"),
        tax_total=Decimal("0.72"),
        total=Decimal("14.34"),
        reason="replay found a difference",
        issued_at=ISSUED_AT,
    )
    voided = InvoiceVoided(
        **common,
        invoice_id=invoice_id,
        invoice_number="INV-2024-09-000001",
        revision=1,
        reason="duplicate account",
        voided_at=ISSUED_AT,
    )
    return [(issued, invoice_id), (credited, credit_note_id), (voided, invoice_id)]


def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_outbox_columns_arrive_as_cloudevents_headers(pipeline: Pipeline) -> None:
    p = pipeline
    written: dict[str, tuple[EventData, str]] = {}
    with p.connect() as conn, conn.transaction():
        for event, document_id in events():
            event_id = deterministic_id("outbox", event.event_type, document_id)
            store.invoices.insert_outbox(
                conn,
                event_id=event_id,
                topic=p.invoices_topic,
                customer_id=CUSTOMER,
                event=event,
                source=EVENT_SOURCE,
                time=ISSUED_AT,
                document_id=document_id,
            )
            written[event_id] = (event, document_id)

    records = drain(p.settings.kafka, p.invoices_topic, expected=3, timeout_s=90)
    assert len(records) == 3
    # One customer, one partition: the order of the outbox rows is kept.
    assert len({r.partition() for r in records}) == 1
    assert [headers_dict(headers_of(r))["ce_type"] for r in records] == [
        "invoice.issued",
        "credit_note.issued",
        "invoice.voided",
    ]
    headers_schema = validator("headers.schema.json")
    key_schema = validator("key.schema.json")
    for record in records:
        headers = headers_dict(headers_of(record))
        event, document_id = written[headers["ce_id"]]
        assert headers["ce_specversion"] == "1.0"
        assert headers["ce_type"] == event.event_type
        assert headers["ce_time"] == "2024-10-01T00:00:05.123456Z"
        assert headers["ce_source"] == EVENT_SOURCE
        assert headers["ce_subject"] == CUSTOMER
        assert headers["content-type"] == "application/json"
        assert headers["document_id"] == document_id
        assert headers["id"] == headers["ce_id"]  # Debezium's own header
        assert record.key() == CUSTOMER.encode()
        # Each header appears once (the router adds, the binding names are not repeated).
        names = [name for name, _ in headers_of(record)]
        assert len(names) == len(set(names))

        # The published contracts hold for what really arrives.
        headers_schema.validate(headers)
        key_schema.validate(text(record.key()))
        value = record.value()
        assert value is not None
        validator(f"{event.event_type}.schema.json").validate(json.loads(value))

        # And the pipeline's own decoder accepts the record as it arrives.
        envelope = decode(
            record.key(),
            record.value(),
            headers_of(record),
            allowed=event_models(INVOICES.event_types),
        )
        assert envelope.id == headers["ce_id"]
        assert envelope.type == event.event_type
        assert envelope.time == ISSUED_AT
        assert envelope.subject == CUSTOMER
        assert envelope.data == event
