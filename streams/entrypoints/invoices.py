"""``invoicing invoice …`` and ``invoicing credit-note …``: what an operator does to one
invoice (:mod:`streams.apps.ops.void`, :mod:`streams.apps.ops.credit`)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated

import typer

from streams.entrypoints.common import console, exit_on, settings_of
from streams.topics import INVOICES

app = typer.Typer(help="One invoice: show it, finalize a draft, void it.", no_args_is_help=True)
credit_app = typer.Typer(help="Credit notes: credit part of an invoice.", no_args_is_help=True)


@app.command("void")
def void_command(
    ctx: typer.Context,
    invoice: Annotated[str, typer.Argument(help="The invoice revision: id or number.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (kept with the void, sent in the event).")
    ],
) -> None:
    """Void an issued invoice revision: it becomes voided for good, an invoice.voided
    event goes out through the outbox and the customer gets one email saying so.

    Runs as the admin role through the database function void_invoice(). Exit codes: 0
    voided; 2 refused (no such invoice, not the issued revision, an invalid reason);
    1 the database refused the role."""
    from psycopg import errors

    from streams import bootstrap
    from streams.apps.ops.void import VoidError, void_invoice

    settings = settings_of(ctx)
    with (
        exit_on((VoidError, 2, "refused"), (errors.InsufficientPrivilege, 1, "not allowed")),
        bootstrap.connection(settings, role="admin") as conn,
    ):
        voided = void_invoice(
            conn,
            invoice,
            reason,
            topic=INVOICES.with_prefix(settings.kafka.topic_prefix).name,
        )
    console.print(
        f"voided invoice {voided.invoice_number} (revision {voided.revision}, "
        f"{voided.invoice_id}) at {voided.voided_at.isoformat()} by {voided.voided_by}; "
        f"event {voided.outbox_id}"
    )


@app.command("finalize")
def finalize_command(
    ctx: typer.Context,
    invoice: Annotated[str, typer.Argument(help="The draft's invoice id.")],
    wait: Annotated[
        float,
        typer.Option("--wait", help="Seconds to wait for the owner to issue it (0: do not wait)."),
    ] = 30.0,
) -> None:
    """Finalize a draft now, before its grace period ends: the invoicing worker that owns
    the customer's partition numbers it, issues it, puts invoice.issued on the outbox and
    the customer gets one email (docs/invoices.md "Drafts and finalisation").

    The command writes nothing itself: it checks that ID is an open draft and sends the
    finalisation marker on the customer's partition. Exit codes: 0 finalised (or, with
    --wait 0, requested); 2 refused (not a draft: issued, superseded, voided, already
    finalised or unknown); 1 the marker was requested but not finalised within --wait."""
    from streams import bootstrap
    from streams.apps.ops.finalize import FinalizeError, finalize_draft
    from streams.topics import ACCOUNT_EVENTS

    settings = settings_of(ctx)
    with (
        exit_on((FinalizeError, 2, "refused")),
        bootstrap.connection(settings, role="admin") as conn,
    ):
        done = finalize_draft(
            conn,
            bootstrap.producer(settings),
            ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name,
            invoice,
            wait_s=wait,
        )
    if done.invoice_number is not None:
        console.print(
            f"finalized draft {done.draft.invoice_id} ({done.draft.customer_id} "
            f"{done.draft.billing_period}) as {done.invoice_number}"
        )
        return
    console.print(
        f"finalisation of draft {done.draft.invoice_id} requested (marker {done.marker_id})"
    )
    if wait > 0:
        console.print(f"[yellow]not finalised within {wait:g} s[/]: see `invoicing invoice show`")
        raise typer.Exit(1)


@app.command("show")
def show_command(
    ctx: typer.Context,
    invoice: Annotated[str, typer.Argument(help="An invoice id or number, or a draft's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show an invoice or a draft: status (draft, issued, superseded, voided), number (none
    for a draft), customer, period, totals, and for a draft its grace period and end.
    Exit 2 when ID is neither."""
    import json

    from streams import bootstrap
    from streams.apps.ops.finalize import FinalizeError, show_document

    settings = settings_of(ctx)
    with (
        exit_on((FinalizeError, 2, "not found")),
        bootstrap.connection(settings, role="operator") as conn,
    ):
        shown = show_document(conn, invoice)
    if as_json:
        console.print_json(json.dumps(shown, default=str))
        return
    for key, value in shown.items():
        console.print(f"{key:>16}  {'-' if value is None else value}")


@credit_app.command("create")
def credit_create_command(
    ctx: typer.Context,
    invoice: Annotated[str, typer.Argument(help="The invoice revision: id or number.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (kept with the note, sent in the event).")
    ],
    line: Annotated[
        int | None, typer.Option("--line", help="The invoice line to credit (1, 2, …).")
    ] = None,
    amount: Annotated[
        str | None, typer.Option("--amount", help="The amount to credit on --line.")
    ] = None,
    lines: Annotated[
        Path | None,
        typer.Option("--lines", help="A CSV of line,amount rows, for several lines."),
    ] = None,
) -> None:
    """Issue a partial credit note on an issued invoice revision: never more than what
    is still creditable per line and per invoice, tax pro rata to the line's charged
    tax; a credit_note.issued event goes out through the outbox with the lines and the
    customer gets one email saying what it credits.

    Runs as the admin role through the database function credit_invoice_lines(). Exit
    codes: 0 issued; 2 refused (no such invoice, not the issued revision, more than
    creditable, a bad line, amount or reason); 1 the database refused the role."""
    from psycopg import errors

    from streams import bootstrap
    from streams.apps.ops.credit import (
        CreditError,
        InvalidCredit,
        credit_invoice,
        parse_lines_csv,
    )

    settings = settings_of(ctx)
    with exit_on((CreditError, 2, "refused"), (errors.InsufficientPrivilege, 1, "not allowed")):
        pairs: list[tuple[int, Decimal]]
        if lines is not None:
            if line is not None or amount is not None:
                raise InvalidCredit("give either --lines FILE or --line and --amount")
            pairs = parse_lines_csv(lines.read_text(encoding="utf-8"))
        elif line is not None and amount is not None:
            pairs = parse_lines_csv(f"{line},{amount}")
        else:
            raise InvalidCredit("give --line and --amount, or --lines FILE")
        with bootstrap.connection(settings, role="admin") as conn:
            note = credit_invoice(
                conn,
                invoice,
                pairs,
                reason,
                topic=INVOICES.with_prefix(settings.kafka.topic_prefix).name,
            )
    console.print(
        f"credit note {note.credit_note_number} ({note.credit_note_id}) on invoice "
        f"{note.invoice_id}: subtotal {note.subtotal}, tax {note.tax_total}, total "
        f"{note.total}; event {note.outbox_id}"
    )
