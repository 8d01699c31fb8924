"""schemas/ is what the event models render to, and real encoded events validate."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]

from streams.core.domain.codec import encode
from streams.core.domain.events import (
    EVENT_TYPES,
    BillingPeriodClosed,
    CreditNoteIssued,
    CustomerUpserted,
    Envelope,
    EventData,
    InvoiceIssued,
    InvoiceVoided,
    LineSummary,
    SourceRange,
    TaxAmount,
    UsageRecorded,
    event_models,
)
from streams.devtools.schemas.render import render_schemas, stale_schemas, write_schemas
from streams.topics import REGISTRY

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
WHEN = datetime(2024, 9, 30, 23, 59, 59, 999000, tzinfo=UTC)
#: Topic name → the models of the event types it carries (the registry's ``event_types``).
TOPIC_MODELS = {spec.name: event_models(spec.event_types) for spec in REGISTRY if spec.event_types}
CUSTOMER = "/subscriptions/64e355d7-997c-491d-b0c1-8414dccfcf42"


def sample_events() -> list[EventData]:
    """One real instance of every event type, optional fields filled where they exist."""
    common: dict[str, Any] = {"customer_id": CUSTOMER, "billing_period": "2024-09"}
    return [
        CustomerUpserted(
            customer_id=CUSTOMER,
            name="Zenith Eclipse",
            email="billing+h0123456789abcdef01234567@customers.invalid",
            currency="USD",
            billing_account_id="/providers/Microsoft.Billing/billingAccounts/8611537",
        ),
        UsageRecorded(
            **common,
            amount=Decimal("-0.00000080000"),
            currency="USD",
            quantity=Decimal("2"),
            unit="Requests",
            consumed_quantity=Decimal("2.000000000000000"),
            consumed_unit="Requests",
            sku_id="G95FST5FTYV3JSRX",
            description="$0.40 per million requests",
            region_id=None,
            charge_category="Credit",
            event_time=WHEN,
            provider="Microsoft",
        ),
        BillingPeriodClosed(**common, closed_at=WHEN, lease_fencing_token=7),
        InvoiceIssued(
            **common,
            invoice_id="inv-1",
            invoice_number="INV-1",
            revision=2,
            customer_name="Zenith Eclipse",
            email="billing+x@customers.invalid",
            currency="USD",
            line_count=3,
            subtotal=Decimal("13.62"),
            tax_total=Decimal("2.72"),
            total=Decimal("16.34"),
            taxes=(
                TaxAmount(
                    tax_code="VAT",
                    rate=Decimal("0.2"),
                    taxable_amount=Decimal("13.61648254970"),
                    amount=Decimal("2.72"),
                ),
            ),
            largest_lines=(
                LineSummary(
                    description="compute", amount=Decimal("9.5"), quantity=Decimal("1"), unit="h"
                ),
            ),
            issued_at=WHEN,
            supersedes_invoice_id="inv-0",
            source=(
                SourceRange(
                    topic="billing.account-events.v1", partition=0, first_offset=0, last_offset=224
                ),
            ),
        ),
        CreditNoteIssued(
            **common,
            credit_note_id="cn-1",
            credit_note_number="CN-1",
            invoice_id="inv-0",
            invoice_number="INV-0",
            revision=1,
            customer_name="Zenith Eclipse",
            email="billing+x@customers.invalid",
            currency="USD",
            subtotal=Decimal("1.00"),
            tax_total=Decimal("0.20"),
            total=Decimal("1.20"),
            reason="replay found a difference",
            issued_at=WHEN,
        ),
        InvoiceVoided(
            **common,
            invoice_id="inv-0",
            invoice_number="INV-0",
            revision=1,
            reason="duplicate account",
            voided_at=WHEN,
        ),
    ]


def topic_of(model: type[EventData]) -> str:
    [topic] = [t for t, models in TOPIC_MODELS.items() if model in models]
    return topic


def load(relative: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((SCHEMAS / relative).read_text(encoding="utf-8"))
    return document


def validator(relative: str) -> Draft202012Validator:
    schema = load(relative)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_committed_schemas_are_up_to_date() -> None:
    stale = stale_schemas(SCHEMAS)
    assert stale == [], f"run `python -m streams.devtools.schemas schemas` and commit: {stale}"


def test_every_topic_and_event_type_has_its_files() -> None:
    rendered = {path.as_posix() for path in render_schemas()}
    for spec in REGISTRY:
        assert f"{spec.name}/key.schema.json" in rendered
        assert f"{spec.name}/headers.schema.json" in rendered
    for topic, models in TOPIC_MODELS.items():
        for model in models:
            assert f"{topic}/{model.event_type}.schema.json" in rendered
    # The price book's schema is a document's, not a topic's (checked below), and so
    # are the HTTP bodies' (http/; docs/usage-api.md).
    value_files = {
        p
        for p in rendered
        if not p.endswith(("key.schema.json", "headers.schema.json", "README.md", ".yaml"))
        and not p.startswith(("price-book/", "http/"))
    }
    assert len(value_files) == len(EVENT_TYPES)
    assert "price-book/price-book.schema.json" in rendered
    for body in ("usage-response", "problem", "ingest-response", "cloudevent"):
        assert f"http/{body}.schema.json" in rendered
    assert "http/openapi.yaml" in rendered
    assert "billing.account-events.dlq.v1/README.md" in rendered
    assert "asyncapi.yaml" in rendered


def test_rendering_is_deterministic_and_canonical() -> None:
    first, second = render_schemas(), render_schemas()
    assert first == second
    for path, text in first.items():
        if path.suffix == ".json":
            assert text.endswith("\n")
            assert (
                text
                == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            )
            document = json.loads(text)
            assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
            assert document["$id"].endswith(path.as_posix())
            assert document["title"]


def test_write_touches_only_changed_files_and_stale_reports_drift(tmp_path: Path) -> None:
    written = write_schemas(tmp_path)
    assert sorted(written) == sorted(render_schemas())
    assert write_schemas(tmp_path) == []
    assert stale_schemas(tmp_path) == []

    target = tmp_path / "billing.account-events.v1" / "usage.recorded.schema.json"
    target.write_text(
        target.read_text(encoding="utf-8").replace('"amount"', '"amt"'), encoding="utf-8"
    )
    (tmp_path / "billing.invoices.v1" / "key.schema.json").unlink()
    orphan = tmp_path / "billing.invoices.v1" / "invoice.deleted.schema.json"
    orphan.write_text("{}\n", encoding="utf-8")
    assert stale_schemas(tmp_path) == [
        "billing.account-events.v1/usage.recorded.schema.json",
        "billing.invoices.v1/key.schema.json",
        "billing.invoices.v1/invoice.deleted.schema.json",
    ]
    assert sorted(p.as_posix() for p in write_schemas(tmp_path)) == [
        "billing.account-events.v1/usage.recorded.schema.json",
        "billing.invoices.v1/key.schema.json",
    ]
    assert stale_schemas(tmp_path) == ["billing.invoices.v1/invoice.deleted.schema.json"]


@pytest.mark.parametrize("event", sample_events(), ids=lambda event: event.event_type)
def test_a_real_encoded_event_validates_against_its_committed_schema(event: EventData) -> None:
    record = encode(Envelope.wrap(event, id="e-1", source="urn:test", time=WHEN))
    topic = topic_of(type(event))
    value = json.loads(record.value)
    validator(f"{topic}/{event.event_type}.schema.json").validate(value)
    validator(f"{topic}/key.schema.json").validate(record.key.decode())


def test_the_schema_refuses_what_the_contract_refuses() -> None:
    event = sample_events()[1]
    value = json.loads(encode(Envelope.wrap(event, id="e", source="urn:t", time=WHEN)).value)
    check = validator("billing.account-events.v1/usage.recorded.schema.json")
    for bad in (
        value | {"amount": -8e-07},  # a float amount
        value | {"amount": "1e-7"},  # not a plain decimal string
        value | {"billing_period": "2024-13"},
        value | {"discount": "1"},  # extra field
        {k: v for k, v in value.items() if k != "event_time"},
    ):
        with pytest.raises(ValidationError):
            check.validate(bad)
    with pytest.raises(ValidationError):
        validator("billing.account-events.v1/key.schema.json").validate("has space")
