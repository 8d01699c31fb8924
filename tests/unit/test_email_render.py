"""Email rendering (pure): content, minor units, HTML escaping, deterministic identity,
and the SMTP error classification of the transport."""

from __future__ import annotations

import smtplib
from datetime import UTC, datetime
from decimal import Decimal
from email.message import EmailMessage

import pytest

from streams.adapters.smtp import classify_smtp_error
from streams.apps.email.errors import RenderError, SmtpPermanentError, SmtpTransientError
from streams.apps.email.render import (
    document_ref,
    format_amount,
    format_money,
    format_rate,
    is_zero_total,
    render_email,
)
from streams.core.domain.events import CreditNoteIssued, InvoiceIssued, LineSummary, TaxAmount

INVOICE_ID = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
EVENT_ID = "7d0d3d7c-6a43-4d8e-9a51-31a1a4b0f8aa"
FROM = "billing@invoicing.example"
ISSUED = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)


def invoice(**changes: object) -> InvoiceIssued:
    fields: dict[str, object] = {
        "invoice_id": INVOICE_ID,
        "invoice_number": "INV-2026-000042",
        "revision": 1,
        "customer_id": "cust-1",
        "customer_name": "Acme Corp",
        "email": "ap@acme.example",
        "billing_period": "2026-10",
        "currency": "USD",
        "line_count": 1234,
        "subtotal": Decimal("1234.5"),
        "tax_total": Decimal("80.24"),
        "total": Decimal("1314.74"),
        "taxes": (
            TaxAmount(
                tax_code="US-WA-STD",
                rate=Decimal("0.065"),
                taxable_amount=Decimal("1234.5"),
                amount=Decimal("80.24"),
            ),
        ),
        "largest_lines": (
            LineSummary(description="Compute: m5.large hours", amount=Decimal("900.125")),
            LineSummary(description="Storage & <backup>", amount=Decimal("300.3351")),
        ),
        "issued_at": ISSUED,
    }
    fields.update(changes)
    return InvoiceIssued.model_validate(fields)


def credit_note(**changes: object) -> CreditNoteIssued:
    fields: dict[str, object] = {
        "credit_note_id": "a3bb189e-8bf9-3888-9912-ace4e6543002",
        "credit_note_number": "CN-2026-000007",
        "invoice_id": INVOICE_ID.lower(),
        "invoice_number": "INV-2026-000042",
        "revision": 1,
        "customer_id": "cust-1",
        "customer_name": "Acme Corp",
        "email": "ap@acme.example",
        "billing_period": "2026-10",
        "currency": "EUR",
        "subtotal": Decimal("10"),
        "tax_total": Decimal("2"),
        "total": Decimal("12"),
        "reason": "replay found a difference",
        "issued_at": ISSUED,
    }
    fields.update(changes)
    return CreditNoteIssued.model_validate(fields)


def bodies(msg: EmailMessage) -> tuple[str, str]:
    text = msg.get_body(("plain",))
    html_part = msg.get_body(("html",))
    assert text is not None and html_part is not None
    assert isinstance(text, EmailMessage) and isinstance(html_part, EmailMessage)
    return text.get_content(), html_part.get_content()


# ------------------------------------------------------------------ content


def test_invoice_email_carries_every_figure_in_both_alternatives() -> None:
    msg = render_email(invoice(), event_id=EVENT_ID, from_address=FROM)
    assert msg.get_content_type() == "multipart/alternative"
    text, html = bodies(msg)
    for body in (text, html):
        assert "INV-2026-000042" in body
        assert "2026-10" in body
        assert "Acme Corp" in body
        assert "1,234" in body  # number of lines
        assert "1,234.50 USD" in body  # subtotal at two decimals, thousands separator
        assert "US-WA-STD (6.5%)" in body
        assert "80.24 USD" in body
        assert "1,314.74 USD" in body  # total
        assert "Compute: m5.large hours" in body
        assert "900.12 USD" in body  # 900.125 rounded half-even for display
        assert "300.34 USD" in body
        assert "The 2 largest of 1,234 lines" in body
        assert EVENT_ID in body
    assert str(msg["Subject"]) == "Invoice INV-2026-000042 for 2026-10: 1,314.74 USD"
    assert str(msg["From"]) == FROM
    assert str(msg["To"]) == "Acme Corp <ap@acme.example>"
    assert str(msg["Date"]) == "Sun, 01 Nov 2026 00:05:00 +0000"


def test_invoice_headers_trace_the_outbox_event() -> None:
    msg = render_email(invoice(revision=3), event_id=EVENT_ID, from_address=FROM)
    assert msg["X-Outbox-Event-Id"] == EVENT_ID
    assert msg["X-Invoice-Id"] == INVOICE_ID.lower()
    assert msg["X-Invoice-Revision"] == "3"
    assert msg["X-Document-Key"] == f"invoice:{INVOICE_ID.lower()}:r3"
    assert msg["X-Credit-Note-Id"] is None


def test_credit_note_email() -> None:
    note = credit_note()
    msg = render_email(note, event_id=EVENT_ID, from_address=FROM)
    text, html = bodies(msg)
    for body in (text, html):
        assert "CN-2026-000007" in body
        assert "INV-2026-000042 (revision 1)" in body
        assert "12.00 EUR" in body
        assert "replay found a difference" in body
    assert msg["Message-ID"] == "<credit-note-a3bb189e-8bf9-3888-9912-ace4e6543002@invoicing.local>"
    assert msg["X-Credit-Note-Id"] == note.credit_note_id
    assert msg["X-Credited-Invoice-Id"] == INVOICE_ID.lower()
    assert msg["X-Invoice-Id"] is None  # counting by X-Invoice-Id counts invoice emails only


# ------------------------------------------------------------------ money


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        ("1234.5", "USD", "1,234.50"),
        ("0.125", "USD", "0.12"),  # half-even
        ("0.135", "USD", "0.14"),
        ("1234.5", "JPY", "1,234"),  # half-even at zero decimals
        ("1235.5", "JPY", "1,236"),
        ("1.0005", "BHD", "1.000"),
        ("-1234567.891", "EUR", "-1,234,567.89"),
        ("-0.001", "USD", "0.00"),  # no "-0.00"
        ("0.00000080000", "USD", "0.00"),
    ],
)
def test_amounts_use_the_currency_minor_unit(amount: str, currency: str, expected: str) -> None:
    assert format_amount(Decimal(amount), currency) == expected


def test_jpy_invoice_has_no_decimals() -> None:
    doc = invoice(
        currency="JPY",
        subtotal=Decimal("1000"),
        tax_total=Decimal("100"),
        total=Decimal("1100"),
        taxes=(),
        largest_lines=(),
    )
    text, _ = bodies(render_email(doc, event_id=EVENT_ID, from_address=FROM))
    assert "1,100 JPY" in text
    assert "1,100.00" not in text


def test_rates_are_percentages_without_trailing_zeros() -> None:
    assert format_rate(Decimal("0.2")) == "20%"
    assert format_rate(Decimal("0.065")) == "6.5%"
    assert format_rate(Decimal("0.0")) == "0%"
    assert format_money(Decimal("5"), "GBP") == "5.00 GBP"


@pytest.mark.parametrize(
    ("total", "zero"),
    [
        ("0", True),
        ("0.004", True),
        ("-0.004", True),
        ("0.005", True),  # half-even: 0.005 → 0.00
        ("0.015", False),  # half-even: 0.015 → 0.02
        ("0.01", False),
        ("-0.01", False),  # a net credit is emailed
    ],
)
def test_zero_total_is_decided_after_rounding(total: str, zero: bool) -> None:
    assert is_zero_total(invoice(total=Decimal(total))) is zero


def test_unknown_currency_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="unknown currency"):
        format_amount(Decimal("1"), "XXX")


# ------------------------------------------------------------------ escaping and headers


def test_customer_name_is_escaped_in_html() -> None:
    name = '<script>alert("x")</script> & Sons'
    msg = render_email(invoice(customer_name=name), event_id=EVENT_ID, from_address=FROM)
    text, html = bodies(msg)
    assert "<script>" not in html
    # markupsafe escapes a double quote as &#34; (the same character as &quot;)
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; Sons" in html
    assert "Storage &amp; &lt;backup&gt;" in html
    assert name in text  # plain text is not HTML: shown as is
    to = msg["To"]
    assert to.addresses[0].display_name == name
    assert to.addresses[0].addr_spec == "ap@acme.example"


def test_newlines_in_names_cannot_inject_headers() -> None:
    msg = render_email(
        invoice(customer_name="Evil\r\nBcc: victim@example.com", invoice_number="INV\n1"),
        event_id=EVENT_ID,
        from_address=FROM,
    )
    assert msg["Bcc"] is None
    assert "\n" not in str(msg["Subject"])
    assert msg["To"].addresses[0].display_name == "Evil Bcc: victim@example.com"


@pytest.mark.parametrize("address", ["not-an-address", "", "a@b@c", "x@y\nBcc: z@w"])
def test_invalid_recipient_is_a_render_error(address: str) -> None:
    with pytest.raises(RenderError, match="recipient"):
        render_email(invoice(email=address), event_id=EVENT_ID, from_address=FROM)


def test_event_id_with_a_newline_is_a_render_error() -> None:
    with pytest.raises(RenderError):
        render_email(invoice(), event_id="abc\r\nBcc: x@y.z", from_address=FROM)


# ------------------------------------------------------------------ identity


def test_message_id_is_derived_from_the_document_only() -> None:
    first = render_email(invoice(), event_id=EVENT_ID, from_address=FROM)
    again = render_email(invoice(), event_id="another-event", from_address=FROM)
    revised = render_email(invoice(revision=2), event_id=EVENT_ID, from_address=FROM)
    expected = f"<invoice-{INVOICE_ID.lower()}-r1@invoicing.local>"
    assert first["Message-ID"] == again["Message-ID"] == expected
    assert revised["Message-ID"] == f"<invoice-{INVOICE_ID.lower()}-r2@invoicing.local>"
    ref = document_ref(invoice())
    assert ref.message_id == expected
    assert ref.document_key == f"invoice:{INVOICE_ID.lower()}:r1"
    assert ref.document_type == "invoice"
    assert document_ref(invoice(), domain="mail.example").message_id.endswith("@mail.example>")


def test_rendering_is_deterministic_apart_from_the_mime_boundary() -> None:
    a = render_email(invoice(), event_id=EVENT_ID, from_address=FROM)
    b = render_email(invoice(), event_id=EVENT_ID, from_address=FROM)
    assert a.items() == b.items()[: len(a.items())]
    assert bodies(a) == bodies(b)


def test_a_document_id_that_is_not_a_uuid_is_refused() -> None:
    with pytest.raises(RenderError, match="not a UUID"):
        document_ref(invoice(invoice_id="INV-1"))


def test_largest_lines_are_capped() -> None:
    lines = tuple(LineSummary(description=f"line {i}", amount=Decimal(100 - i)) for i in range(20))
    text, _ = bodies(
        render_email(
            invoice(largest_lines=lines), event_id=EVENT_ID, from_address=FROM, max_lines=3
        )
    )
    assert "line 2" in text
    assert "line 3" not in text
    assert "The 3 largest of 1,234 lines" in text


# ------------------------------------------------------------------ SMTP classification


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(111, "refused"), SmtpTransientError),
        (TimeoutError("timed out"), SmtpTransientError),
        (smtplib.SMTPServerDisconnected("gone"), SmtpTransientError),
        (smtplib.SMTPRecipientsRefused({"a@b.c": (450, b"mailbox busy")}), SmtpTransientError),
        (smtplib.SMTPRecipientsRefused({"a@b.c": (550, b"no such user")}), SmtpPermanentError),
        (smtplib.SMTPDataError(554, b"content rejected"), SmtpPermanentError),
        (smtplib.SMTPDataError(451, b"try later"), SmtpTransientError),
        # Refusals that would hit every email are configuration faults: never "skip".
        (smtplib.SMTPSenderRefused(550, b"bad sender", "billing@x"), SmtpTransientError),
        (smtplib.SMTPConnectError(554, b"no service"), SmtpTransientError),
        (smtplib.SMTPHeloError(501, b"bad helo"), SmtpTransientError),
    ],
)
def test_smtp_errors_are_split_transient_and_permanent(exc: Exception, kind: type) -> None:
    result = classify_smtp_error(exc)
    assert type(result) is kind
    if isinstance(result, SmtpPermanentError):
        assert result.reason.startswith("smtp_rejected: ")
