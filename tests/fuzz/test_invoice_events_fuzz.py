"""Fuzz: generated invoice-topic records through a real email sender process.

Generated records for ``billing.invoices.v1`` (tests/fuzz/records.py:
:func:`~tests.fuzz.records.invoice_record`, the same mix as the account events: valid, mutated
valid, random bytes, wrong types, huge and very precise numbers, control characters, invalid UTF-8,
oversize values, deep JSON, missing or wrong headers, keys that disagree with the payload) are
interleaved with clean ``invoice.issued`` events, produced to the sandbox's invoices topic and read
by one email sender process (its SMTP sink is the sandbox's). Asserted (docs/design.md, invariant 5,
for the email sender as for the workers):

* the sender process never dies;
* every partition of the invoices topic is read to its end by the email group;
* every record the codec refuses is on the invoices dead-letter topic exactly once,
  with a reason, its source coordinates and its original key and value; nothing is
  dead-lettered twice, and no clean record at all;
* every clean invoice (its row stored, as issuance would) is emailed with its PDF
  (``email_deliveries`` ``sent``) and no email is sent twice (one message per Message-ID
  in the sink's Maildir); a generated ``invoice.issued`` whose document is not stored is
  recorded ``skipped`` (``render_failed``), never retried forever.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.apps.email.sender import ALLOWED_TYPES, invoices_dlq_topic
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, InvoiceIssued
from streams.devtools.stack.maildir import count_by_header
from tests.fuzz.harness import (
    MIN_ACCEPTED_SHARE,
    accepted,
    check_dead_letters,
    check_must_refuse,
    dead_letters,
    partition_lags,
    produce,
    refused,
    wait_until,
)
from tests.fuzz.records import FuzzRecord, generate, invoice_record
from tests.support.documents import store_invoice
from tests.support.pipeline import Pipeline

#: Generated invoice-topic records per run (the account-events test carries the 10,000).
RECORDS = int(os.environ.get("FUZZ_EMAIL_RECORDS", "3000"))
CLEAN = 60


def clean_invoices(unique: str, rng: random.Random) -> list[tuple[str, FuzzRecord, InvoiceIssued]]:
    """``CLEAN`` valid ``invoice.issued`` records with a non-zero total: (customer, record,
    the event's data, whose invoice row the test stores for the PDF)."""
    out = []
    for n in range(CLEAN):
        customer = f"clean-{unique}-{n:03d}"
        subtotal = Decimal(rng.randint(1, 10**9)).scaleb(-2)
        tax = Decimal(rng.randint(0, 10**7)).scaleb(-2)
        data = InvoiceIssued(
            invoice_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            invoice_number=f"INV-2025-03-{n + 1:06d}",
            revision=1,
            customer_id=customer,
            customer_name=f"Clean {n}",
            email=f"{customer}@example.test",
            billing_period="2025-03",
            currency="USD",
            line_count=rng.randint(1, 20),
            subtotal=subtotal,
            tax_total=tax,
            total=subtotal + tax,
            issued_at=datetime(2025, 4, 1, 0, 5, tzinfo=UTC),
        )
        encoded = encode(Envelope.wrap(data, id=f"ii-{customer}", source="/t"))
        out.append(
            (
                customer,
                FuzzRecord(encoded.key, encoded.value, encoded.headers, "clean invoice"),
                data,
            )
        )
    return out


@pytest.mark.timeout(300)
def test_generated_invoice_events_never_stall_or_crash_the_email_sender(
    pipeline: Pipeline, fuzz_seed: int
) -> None:
    p = pipeline
    rng = random.Random(fuzz_seed)
    generated = generate(fuzz_seed, RECORDS, make=invoice_record)
    clean = clean_invoices(p.unique, rng)
    with p.connect() as conn:  # the clean invoices' rows: the sender renders their PDFs
        for _c, _r, data in clean:
            store_invoice(conn, data)
    tagged = [(r, False) for r in generated] + [(r, True) for _c, r, _d in clean]
    rng.shuffle(tagged)
    records = [r for r, _ in tagged]

    coords = produce(p.settings.kafka, p.invoices_topic, records)
    bad = {
        at: record
        for at, (record, is_clean) in zip(coords, tagged, strict=True)
        if not is_clean and refused(record, ALLOWED_TYPES) is not None
    }
    clean_at = {at for at, (_r, is_clean) in zip(coords, tagged, strict=True) if is_clean}
    must = check_must_refuse(generated, ALLOWED_TYPES)
    accepted_at = {
        at: envelope
        for at, (record, is_clean) in zip(coords, tagged, strict=True)
        if not is_clean and (envelope := accepted(record, ALLOWED_TYPES)) is not None
    }
    assert len(accepted_at) >= MIN_ACCEPTED_SHARE * len(generated), (
        f"only {len(accepted_at)} of {len(generated)} generated records accepted by the codec"
    )
    print(f"fuzz(email): must be refused, by reason {must}; accepted {len(accepted_at)}")
    print(
        f"fuzz(email): produced {len(records)} records ({len(generated)} generated, "
        f"{len(bad)} refused by the codec; {len(clean)} clean invoices)"
    )

    group = p.settings.worker.email_group
    started = time.monotonic()
    senders = p.workers.start("email", 1)

    def alive() -> None:
        dead = [w.name for w in senders if w.process.poll() is not None]
        assert not dead, f"email sender died: {dead}\n{p.worker_logs()}"

    def no_lag() -> bool:
        alive()
        lags = partition_lags(p.settings.kafka, group, p.invoices_topic)
        return bool(lags) and not any(lags.values())

    def detail() -> str:
        return (
            f"lags {partition_lags(p.settings.kafka, group, p.invoices_topic)}\n{p.worker_logs()}"
        )

    read_s = wait_until("every invoices partition read to its end", no_lag, 200, detail)
    elapsed = time.monotonic() - started
    print(
        f"fuzz(email): {len(records)} records read by the email sender in {read_s:.1f}s "
        f"({len(records) / max(elapsed, 1e-9):.0f} records/s, from start-up)"
    )

    letters = dead_letters(p.settings, invoices_dlq_topic(p.settings))
    kinds = check_dead_letters(letters, p.invoices_topic, bad, clean_at)
    print(f"fuzz(email): dead letters by kind {kinds}")
    assert kinds.get("unwritable", 0) == 0, (
        "invoice events the contract accepted but PostgreSQL refused: the contract misses a bound"
    )
    # Every accepted invoice or credit note has its delivery row (sent, skipped, refused:
    # by its event id) or is dead-lettered; a voided invoice is ignored by design.
    dead_at = {letter.coords for letter in letters}
    with p.connect() as conn:
        delivered = {str(r[0]) for r in conn.execute("SELECT event_id FROM email_deliveries")}
    dropped = [
        (at, env.data.event_type, env.id)
        for at, env in accepted_at.items()
        if env.data.event_type != "invoice.voided" and at not in dead_at and env.id not in delivered
    ]
    assert not dropped, (
        f"{len(dropped)} accepted invoice events neither delivered nor dead-lettered: {dropped[:5]}"
    )

    wanted = {customer for customer, _r, _d in clean}
    with p.connect() as conn:
        sent = {
            row[0]
            for row in conn.execute(
                "SELECT customer_id FROM email_deliveries WHERE status = 'sent' "
                "AND customer_id = ANY(%s)",
                (sorted(wanted),),
            ).fetchall()
        }
    assert sent == wanted, f"clean invoices not emailed: {sorted(wanted - sent)[:5]}"
    counts = count_by_header(p.maildir, "Message-ID")
    twice = {mid: n for mid, n in counts.items() if n > 1}
    assert not twice, f"emails sent more than once: {list(twice.items())[:5]}"
    alive()
