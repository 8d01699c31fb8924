"""CloudEvents binary-mode codec: round trip and every InvalidEvent reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.core.domain.codec import decode, encode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    InvoiceIssued,
    LineSummary,
    SourceRange,
    TaxAmount,
    UsageRecorded,
    close_marker_id,
    event_models,
    invoice_id_for,
)
from streams.topics import INVOICES

CUSTOMER = "/subscriptions/64e355d7-997c-491d-b0c1-8414dccfcf42"
WHEN = datetime(2024, 9, 18, 22, tzinfo=UTC)


def usage_envelope(customer: str = CUSTOMER) -> Envelope:
    data = UsageRecorded(
        customer_id=customer,
        billing_period="2024-09",
        amount=Decimal("-0.00000080000"),
        currency="USD",
        quantity=Decimal("2.000"),
        unit="Requests",
        event_time=WHEN,
        provider="Microsoft",
    )
    return Envelope.wrap(data, id="11472", source="urn:test:focus", time=WHEN)


def headers_of(envelope: Envelope) -> list[tuple[str, bytes]]:
    return encode(envelope).headers


def test_round_trip_usage() -> None:
    envelope = usage_envelope()
    record = encode(envelope)
    assert record.key == CUSTOMER.encode()
    assert json.loads(record.value)["amount"] == "-0.00000080000"
    assert dict(record.headers)["ce_time"] == b"2024-09-18T22:00:00Z"
    decoded = decode(record.key, record.value, record.headers)
    assert decoded == envelope
    assert decoded.data.amount.as_tuple().exponent == -11


def test_round_trip_every_account_and_invoice_type() -> None:
    envelopes = [
        Envelope.wrap(
            CustomerUpserted(
                customer_id="c-1",
                name="Atlas",
                email="billing+c-1@customers.invalid",
                currency="USD",
            ),
            id="cu-1",
            source="urn:test",
            time=WHEN,
        ),
        Envelope.wrap(
            BillingPeriodClosed(customer_id="c-1", billing_period="2024-09", closed_at=WHEN),
            id=close_marker_id("c-1", "2024-09"),
            source="urn:test",
            time=WHEN,
        ),
        Envelope.wrap(
            InvoiceIssued(
                invoice_id=invoice_id_for("c-1", "2024-09", 1),
                invoice_number="INV-2024-09-000001",
                revision=1,
                customer_id="c-1",
                customer_name="Atlas",
                email="billing+c-1@customers.invalid",
                billing_period="2024-09",
                currency="USD",
                line_count=2,
                subtotal=Decimal("10.00"),
                tax_total=Decimal("2.00"),
                total=Decimal("12.00"),
                taxes=(
                    TaxAmount(
                        tax_code="VAT",
                        rate=Decimal("0.2"),
                        taxable_amount=Decimal("10.000"),
                        amount=Decimal("2.00"),
                    ),
                ),
                largest_lines=(LineSummary(description="compute", amount=Decimal("9.999")),),
                issued_at=WHEN,
                source=(
                    SourceRange(
                        topic="billing.account-events.v1",
                        partition=3,
                        first_offset=1,
                        last_offset=9,
                    ),
                ),
            ),
            id="inv-1",
            source="urn:test",
            time=WHEN,
        ),
    ]
    for envelope in envelopes:
        record = encode(envelope)
        assert decode(record.key, record.value, record.headers) == envelope


def test_headers_may_be_a_mapping() -> None:
    record = encode(usage_envelope())
    assert decode(record.key, record.value, dict(record.headers)) == usage_envelope()


@pytest.mark.parametrize("missing", ["ce_id", "ce_type", "ce_subject", "ce_specversion"])
def test_missing_header(missing: str) -> None:
    record = encode(usage_envelope())
    headers = [(name, value) for name, value in record.headers if name != missing]
    with pytest.raises(InvalidEvent, match=f"missing CloudEvents header.*{missing}"):
        decode(record.key, record.value, headers)


def test_unknown_type() -> None:
    record = encode(usage_envelope())
    headers = [(n, b"usage.deleted" if n == "ce_type" else v) for n, v in record.headers]
    with pytest.raises(InvalidEvent, match=r"unknown event type 'usage\.deleted'"):
        decode(record.key, record.value, headers)


def test_type_not_allowed_on_the_topic() -> None:
    record = encode(usage_envelope())
    with pytest.raises(InvalidEvent, match="does not belong on this topic"):
        decode(
            record.key,
            record.value,
            record.headers,
            allowed=event_models(INVOICES.event_types),
        )


def test_key_differs_from_subject() -> None:
    record = encode(usage_envelope())
    with pytest.raises(InvalidEvent, match="differs from ce_subject"):
        decode(b"someone-else", record.value, record.headers)


def test_missing_key() -> None:
    record = encode(usage_envelope())
    with pytest.raises(InvalidEvent, match="no key"):
        decode(None, record.value, record.headers)


def test_data_customer_differs_from_key() -> None:
    record = encode(usage_envelope())
    other = json.loads(record.value) | {"customer_id": "c-2"}
    with pytest.raises(InvalidEvent, match=r"data\.customer_id"):
        decode(record.key, json.dumps(other).encode(), record.headers)


@pytest.mark.parametrize("value", [b"{not json", b"\xff\xfe", b""])
def test_non_json_value(value: bytes) -> None:
    record = encode(usage_envelope())
    with pytest.raises(InvalidEvent, match="not JSON"):
        decode(record.key, value, record.headers)


def test_float_amount_is_refused() -> None:
    record = encode(usage_envelope())
    payload = json.loads(record.value) | {"amount": 0.1}
    with pytest.raises(InvalidEvent, match="amount"):
        decode(record.key, json.dumps(payload).encode(), record.headers)


def test_extra_field_is_refused() -> None:
    record = encode(usage_envelope())
    payload = json.loads(record.value) | {"discount": "1.00"}
    with pytest.raises(InvalidEvent, match="discount"):
        decode(record.key, json.dumps(payload).encode(), record.headers)


def test_non_utf8_header_and_bad_time() -> None:
    record = encode(usage_envelope())
    with pytest.raises(InvalidEvent, match="not UTF-8"):
        decode(record.key, record.value, [*record.headers, ("ce_source", b"\xff")])
    naive = [(n, b"2024-09-18T22:00:00" if n == "ce_time" else v) for n, v in record.headers]
    with pytest.raises(InvalidEvent, match="invalid CloudEvents attributes"):
        decode(record.key, record.value, naive)


def test_wrong_specversion_and_content_type() -> None:
    record = encode(usage_envelope())
    old = [(n, b"0.3" if n == "ce_specversion" else v) for n, v in record.headers]
    with pytest.raises(InvalidEvent, match="ce_specversion"):
        decode(record.key, record.value, old)
    avro = [(n, b"application/avro" if n == "content-type" else v) for n, v in record.headers]
    with pytest.raises(InvalidEvent, match="content-type"):
        decode(record.key, record.value, avro)
