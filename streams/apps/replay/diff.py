"""Compare a customer's issued invoice with the invoice recomputed from the re-read usage (no I/O).

A **difference** is any of (docs/replay.md "What counts as a difference"):

* ``missing_invoice`` — usage of a closed period and no issued revision (and
  no hold: the caller decides that);
* ``usage_not_invoiced`` — event ids of the rebuilt usage that the issued
  revision's ``invoice_lines`` lack: late usage (read after the close marker,
  ``late=True``) or a lost write (``stored=False``: not in ``usage_lines``);
* ``invoiced_not_in_usage`` — invoice lines whose event the re-read did not
  find although their offset lies inside the re-read window;
* ``amount_changed`` — the same event id with another amount (a conflict the
  invoice resolved otherwise, or another plan markup);
* ``charges_changed`` — a rated invoice's charge lines (by their deterministic
  line id) added, removed or with another amount: another plan version, more or
  fewer metered events, another price (shadow re-rating under a candidate book);
* changed totals — subtotal, tax total or total of the recomputed invoice
  differ from the issued one (e.g. a tax rate changed).

Invoice lines that are not in the rebuilt usage **and** lie outside the window
(below its start offsets, or at/after its end offsets) cannot be judged: they
are returned in :attr:`CustomerDiff.outside_window` and the customer must not
be corrected from this window (widen ``--margin-days``).

Money is ``Decimal`` in the currency's units; JSON renders it as strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from streams.core.domain.events import ChargeSummary
from streams.core.domain.invoice import InvoiceTotals, UsageLine

DiffKind = Literal["missing_invoice", "changed"]


@dataclass(frozen=True)
class IssuedLine:
    """One line of the issued revision, as stored in ``invoice_lines``."""

    event_id: str
    amount: Decimal
    partition: int
    offset: int


@dataclass(frozen=True)
class IssuedInvoice:
    """The current (``status = 'issued'``) revision of a customer's invoice for the period."""

    invoice_id: str
    invoice_number: str
    revision: int
    customer_id: str
    currency: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    line_count: int
    source_partition: int
    close_offset: int
    lines: tuple[IssuedLine, ...]
    charges: tuple[IssuedCharge, ...] = ()


@dataclass(frozen=True)
class IssuedCharge:
    """One rated charge line of the issued revision (``invoice_charges``)."""

    line_id: str
    description: str
    amount: Decimal


@dataclass(frozen=True)
class LineRef:
    """A line named by the report: its event, amount and where it was read.

    ``late``: read at or after the issued revision's close marker (None when
    there is no issued revision). ``stored``: the event is in ``usage_lines``
    (None when not known, e.g. for invoice lines).
    """

    event_id: str
    amount: Decimal
    partition: int
    offset: int
    late: bool | None = None
    stored: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event_id": self.event_id,
            "amount": str(self.amount),
            "partition": self.partition,
            "offset": self.offset,
        }
        if self.late is not None:
            out["late"] = self.late
        if self.stored is not None:
            out["stored"] = self.stored
        return out


@dataclass(frozen=True)
class AmountChange:
    event_id: str
    issued: Decimal
    rebuilt: Decimal


@dataclass(frozen=True)
class ChargeChange:
    """A charge line whose amount differs: ``issued`` None = a new line, ``rebuilt``
    None = a line the recomputation no longer has; ``delta`` = rebuilt - issued."""

    line_id: str
    description: str
    issued: Decimal | None
    rebuilt: Decimal | None

    @property
    def delta(self) -> Decimal:
        return (self.rebuilt or Decimal(0)) - (self.issued or Decimal(0))

    def to_json(self) -> dict[str, Any]:
        return {
            "line_id": self.line_id,
            "description": self.description,
            "issued": None if self.issued is None else str(self.issued),
            "rebuilt": None if self.rebuilt is None else str(self.rebuilt),
            "delta": str(self.delta),
        }


@dataclass(frozen=True)
class Figures:
    """The totals an invoice states (currency units; ``subtotal`` and tax rounded once)."""

    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    line_count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "subtotal": str(self.subtotal),
            "tax_total": str(self.tax_total),
            "total": str(self.total),
            "line_count": self.line_count,
        }


@dataclass(frozen=True)
class CustomerDiff:
    """How a customer's recomputed invoice differs from what was issued.

    ``issued`` is None for a missing invoice. ``has_difference`` is what decides
    whether an apply writes anything.
    """

    customer_id: str
    billing_period: str
    currency: str
    kind: DiffKind
    issued: IssuedInvoice | None
    recomputed: Figures
    usage_not_invoiced: tuple[LineRef, ...]
    invoiced_not_in_usage: tuple[LineRef, ...]
    amount_changed: tuple[AmountChange, ...]
    outside_window: tuple[LineRef, ...]
    charges_changed: tuple[ChargeChange, ...] = ()

    @property
    def issued_figures(self) -> Figures | None:
        if self.issued is None:
            return None
        return Figures(
            self.issued.subtotal, self.issued.tax_total, self.issued.total, self.issued.line_count
        )

    @property
    def totals_changed(self) -> bool:
        old = self.issued_figures
        return old is None or (old.subtotal, old.tax_total, old.total) != (
            self.recomputed.subtotal,
            self.recomputed.tax_total,
            self.recomputed.total,
        )

    @property
    def lines_changed(self) -> bool:
        return bool(
            self.usage_not_invoiced
            or self.invoiced_not_in_usage
            or self.amount_changed
            or self.charges_changed
        )

    @property
    def has_difference(self) -> bool:
        return self.issued is None or self.lines_changed or self.totals_changed

    @property
    def judgeable(self) -> bool:
        """False when invoice lines outside the window keep the replay from judging."""
        return not self.outside_window

    @property
    def delta(self) -> Figures:
        """Recomputed minus issued (zero issued for a missing invoice)."""
        old = self.issued_figures or Figures(Decimal(0), Decimal(0), Decimal(0), 0)
        return Figures(
            self.recomputed.subtotal - old.subtotal,
            self.recomputed.tax_total - old.tax_total,
            self.recomputed.total - old.total,
            self.recomputed.line_count - old.line_count,
        )

    def reason(self) -> str:
        """A one-line reason, e.g. for the credit note: what changed."""
        if self.issued is None:
            return "invoice missing: usage of a closed period was never invoiced"
        parts = []
        if self.usage_not_invoiced:
            late = sum(1 for line in self.usage_not_invoiced if line.late)
            parts.append(f"{len(self.usage_not_invoiced)} usage line(s) not invoiced ({late} late)")
        if self.invoiced_not_in_usage:
            parts.append(f"{len(self.invoiced_not_in_usage)} invoiced line(s) absent from usage")
        if self.amount_changed:
            parts.append(f"{len(self.amount_changed)} line amount(s) changed")
        if self.charges_changed:
            parts.append(f"{len(self.charges_changed)} charge line(s) changed")
        if not parts and self.totals_changed:
            parts.append("totals changed")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        issued = self.issued
        return {
            "customer_id": self.customer_id,
            "billing_period": self.billing_period,
            "currency": self.currency,
            "kind": self.kind,
            "issued": None
            if issued is None
            else {
                "invoice_id": issued.invoice_id,
                "invoice_number": issued.invoice_number,
                "revision": issued.revision,
                **Figures(
                    issued.subtotal, issued.tax_total, issued.total, issued.line_count
                ).to_json(),
            },
            "recomputed": self.recomputed.to_json(),
            "delta": self.delta.to_json(),
            "totals_changed": self.totals_changed,
            "usage_not_invoiced": [line.to_json() for line in self.usage_not_invoiced],
            "invoiced_not_in_usage": [line.to_json() for line in self.invoiced_not_in_usage],
            "amount_changed": [
                {"event_id": c.event_id, "issued": str(c.issued), "rebuilt": str(c.rebuilt)}
                for c in self.amount_changed
            ],
            "outside_window": [line.to_json() for line in self.outside_window],
            "charges_changed": [change.to_json() for change in self.charges_changed],
            "reason": self.reason(),
        }


def lines_differ(
    issued: IssuedInvoice | None,
    lines: Sequence[UsageLine],
    charges: Sequence[ChargeSummary] = (),
) -> bool:
    """Whether the rebuilt lines (and charge lines) are another set (ids or amounts) than
    the issued revision's."""
    if issued is None:
        return True
    stored = {line.event_id: line.amount for line in issued.lines}
    rebuilt = {line.event_id: line.amount for line in lines}
    stored_charges = {charge.line_id: charge.amount for charge in issued.charges}
    rebuilt_charges = {charge.line_id: charge.amount for charge in charges}
    return stored != rebuilt or stored_charges != rebuilt_charges


def charge_changes(
    issued: IssuedInvoice | None, charges: Sequence[ChargeSummary]
) -> tuple[ChargeChange, ...]:
    """Charge lines added, removed or re-priced, in the recomputed order then the
    issued lines that are gone. None issued: no change is listed (a missing invoice
    is a difference by itself)."""
    if issued is None:
        return ()
    before = {charge.line_id: charge for charge in issued.charges}
    after = {charge.line_id: charge for charge in charges}
    changes = [
        ChargeChange(
            charge.line_id,
            charge.description,
            before[charge.line_id].amount if charge.line_id in before else None,
            charge.amount,
        )
        for charge in charges
        if charge.line_id not in before or before[charge.line_id].amount != charge.amount
    ]
    changes += [
        ChargeChange(line_id, charge.description, charge.amount, None)
        for line_id, charge in before.items()
        if line_id not in after
    ]
    return tuple(changes)


def compare(
    *,
    customer_id: str,
    billing_period: str,
    issued: IssuedInvoice | None,
    lines: Sequence[UsageLine],
    totals: InvoiceTotals,
    window: Mapping[int, tuple[int, int]],
    stored_event_ids: frozenset[str] | set[str],
) -> CustomerDiff:
    """The difference between ``issued`` and the invoice of ``lines`` with ``totals``.

    Args:
        issued: the issued revision (None: no issued invoice).
        lines: the customer's rebuilt usage of the period (distinct event ids).
        totals: the recomputed invoice's totals (of ``lines`` and, rated, its charges:
            ``totals.charges``).
        window: partition → (start offset, end offset) of the re-read (end exclusive).
        stored_event_ids: the event ids of the period present in ``usage_lines``.
    """
    rebuilt = {line.event_id: line for line in lines}
    invoiced = {line.event_id: line for line in issued.lines} if issued else {}

    def late(line: UsageLine) -> bool | None:
        if issued is None:
            return None
        return line.source_partition == issued.source_partition and (
            line.source_offset >= issued.close_offset
        )

    not_invoiced = tuple(
        LineRef(
            line.event_id,
            line.amount,
            line.source_partition,
            line.source_offset,
            late=late(line),
            stored=line.event_id in stored_event_ids,
        )
        for line in lines
        if line.event_id not in invoiced
    )
    absent: list[LineRef] = []
    outside: list[LineRef] = []
    for line in sorted(invoiced.values(), key=lambda item: (item.partition, item.offset)):
        if line.event_id in rebuilt:
            continue
        ref = LineRef(line.event_id, line.amount, line.partition, line.offset)
        start, end = window.get(line.partition, (0, 0))
        (absent if start <= line.offset < end else outside).append(ref)
    changed = tuple(
        AmountChange(event_id, invoiced[event_id].amount, line.amount)
        for event_id, line in rebuilt.items()
        if event_id in invoiced and invoiced[event_id].amount != line.amount
    )
    return CustomerDiff(
        customer_id=customer_id,
        billing_period=billing_period,
        currency=totals.currency,
        kind="missing_invoice" if issued is None else "changed",
        issued=issued,
        recomputed=Figures(totals.subtotal, totals.tax_total, totals.total, totals.line_count),
        usage_not_invoiced=not_invoiced,
        invoiced_not_in_usage=tuple(absent),
        amount_changed=changed,
        outside_window=tuple(outside),
        charges_changed=charge_changes(issued, totals.charges),
    )
