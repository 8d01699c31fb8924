"""The example ledger's contract handling, without services (the flow: tests/integration/test_ledger.py)."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from examples.ledger.ledger import Contract, ContractMissing, InvalidRecord, decode, effect_of
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, InvoiceIssued
from tests.unit.test_schemas import sample_events

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "examples" / "ledger"
EVENT_ID = "2ebe352a-1608-50ec-8e16-696f2a1f6836"


@dataclass
class FakeMessage:
    """What the ledger reads of a confluent_kafka.Message."""

    _key: bytes | None
    _value: bytes | None
    _headers: list[tuple[str, bytes]]

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def routed(event: Any) -> FakeMessage:
    """The record as billing.invoices.v1 carries it: codec headers + the router's two."""
    record = encode(
        Envelope.wrap(event, id=EVENT_ID, source="/invoicing/worker", time=datetime.now(UTC))
    )
    headers = [*record.headers, ("id", EVENT_ID.encode()), ("document_id", EVENT_ID.encode())]
    return FakeMessage(record.key, record.value, headers)


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Contract.load(ROOT / "schemas")


def test_the_ledger_imports_nothing_of_the_pipeline() -> None:
    for path in LEDGER.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ("streams", "tests")], path


@pytest.mark.parametrize(
    "event",
    [e for e in sample_events() if e.event_type.startswith(("invoice.", "credit_note."))],
    ids=lambda e: e.event_type,
)
def test_real_invoice_events_decode_and_have_an_effect(contract: Contract, event: Any) -> None:
    event_id, event_type, data = decode(routed(event), contract)  # type: ignore[arg-type]
    assert (event_id, event_type) == (EVENT_ID, event.event_type)
    effect = effect_of(event_type, data)
    assert effect is not None
    assert effect.customer_id == event.customer_id
    if event_type == "invoice.issued":
        assert (effect.document_type, effect.amount) == ("invoice", event.total)
    elif event_type == "credit_note.issued":
        assert (effect.document_type, effect.amount) == ("credit_note", -event.total)
        assert effect.document_id == event.credit_note_id
    else:
        assert (effect.document_type, effect.amount) == ("void", None)


def test_tolerant_of_new_fields_strict_on_the_contract(contract: Contract) -> None:
    issued = next(e for e in sample_events() if isinstance(e, InvoiceIssued))
    message = routed(issued)
    value = json.loads(message.value() or b"")

    def with_value(new: dict[str, Any]) -> FakeMessage:
        return FakeMessage(message.key(), json.dumps(new).encode(), message.headers())

    # An optional field added within v1 is accepted (the schema's "additionalProperties:
    # false" describes today's producer, not a promise).
    _, _, data = decode(with_value(value | {"purchase_order": "PO-1"}), contract)  # type: ignore[arg-type]
    assert data["purchase_order"] == "PO-1"
    assert effect_of("invoice.issued", data).amount == Decimal("16.34")  # type: ignore[union-attr]
    for broken, reason in (
        (value | {"total": 16.34}, "total"),  # a float amount
        ({k: v for k, v in value.items() if k != "total"}, "total"),
        (value | {"customer_id": "someone-else"}, "ce_subject"),
    ):
        with pytest.raises(InvalidRecord, match=reason):
            decode(with_value(broken), contract)  # type: ignore[arg-type]
    headers = [h for h in message.headers() if h[0] != "ce_id"]
    with pytest.raises(InvalidRecord, match="ce_id"):
        decode(FakeMessage(message.key(), message.value(), headers), contract)  # type: ignore[arg-type]
    with pytest.raises(InvalidRecord, match="key"):
        decode(FakeMessage(b"other", message.value(), message.headers()), contract)  # type: ignore[arg-type]


def test_unknown_event_types_decode_without_data(contract: Contract) -> None:
    issued = next(e for e in sample_events() if isinstance(e, InvoiceIssued))
    message = routed(issued)
    headers = [(n, b"invoice.paid" if n == "ce_type" else v) for n, v in message.headers()]
    # A type added within v1 (the headers schema lists today's types) is not invalid:
    # it has no value schema here, so it decodes without data and has no effect.
    decoded = decode(FakeMessage(message.key(), b"{}", headers), contract)  # type: ignore[arg-type]
    assert decoded == (EVENT_ID, "invoice.paid", {})
    assert effect_of("invoice.paid", {}) is None


def test_missing_schemas_are_a_setup_error(tmp_path: Path) -> None:
    with pytest.raises(ContractMissing):
        Contract.load(tmp_path)
