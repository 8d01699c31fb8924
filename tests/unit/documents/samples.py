"""Documents for the tests, with their figures written out (the oracle of the tests)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from streams.core.domain.documents import Document, DocumentLine, DocumentTax, LineGroup

INVOICE_ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
ISSUED = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)


def invoice(lines: int = 3, **changes: object) -> Document:
    """A pre-priced invoice of ``lines`` lines of 12.004601 USD each (line ``i`` is
    "Compute line i"), 6.5 % tax: 3 lines → subtotal 36.01, tax 2.34, total 38.35."""
    fields: dict[str, object] = {
        "kind": "invoice",
        "document_id": INVOICE_ID,
        "number": "INV-2026-10-000042",
        "customer_id": "cust-1",
        "customer_name": 'Acme <Corp> & "Sons"',
        "billing_period": "2026-10",
        "currency": "USD",
        "issued_at": ISSUED,
        "subtotal": Decimal("36.01"),
        "tax_total": Decimal("2.34"),
        "total": Decimal("38.35"),
        "taxes": (DocumentTax("US-WA-STD", Decimal("0.065"), Decimal("36.01"), Decimal("2.34")),),
        "groups": (
            LineGroup(
                None,
                tuple(
                    DocumentLine(f"Compute line {i}", Decimal("12.004601"), Decimal("3"), "h")
                    for i in range(lines)
                ),
            ),
        ),
        "line_count": lines,
    }
    fields.update(changes)
    return Document(**fields)  # type: ignore[arg-type]


def credit_note() -> Document:
    """The full credit note of :func:`invoice`'s revision 1."""
    return Document(
        kind="credit_note",
        document_id="a3bb189e-8bf9-3888-9912-ace4e6543002",
        number="CN-2026-10-000007",
        customer_id="cust-1",
        customer_name="Acme Corp",
        billing_period="2026-10",
        currency="USD",
        issued_at=ISSUED,
        subtotal=Decimal("36.01"),
        tax_total=Decimal("2.34"),
        total=Decimal("38.35"),
        credited_invoice_id=INVOICE_ID,
        credited_invoice_number="INV-2026-10-000042",
        reason="replay found a difference",
    )
