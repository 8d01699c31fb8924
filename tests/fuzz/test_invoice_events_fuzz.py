"""Fuzz: generated invoice-topic records through a real email sender process.

Generated records for ``billing.invoices.v1`` (tests/fuzz/records.py:
:func:`~tests.fuzz.records.invoice_record`, the same mix as the account events:
valid, mutated valid, random bytes, wrong types, huge and very precise numbers,
control characters, invalid UTF-8, oversize values, deep JSON, missing or wrong
headers, keys that disagree with the payload) are interleaved with clean
``invoice.issued`` events, produced to the sandbox's invoices topic and read by one
email sender process (its SMTP sink is the sandbox's). Asserted (DESIGN §3,
invariant 5; issue 10 deliverable 2, "the same for the email sender"):

* the sender process never dies;
* every partition of the invoices topic is read to its end by the email group;
* every record the codec refuses is on the invoices dead-letter topic exactly once,
  with a reason, its source coordinates and its original key and value; nothing is
  dead-lettered twice, and no clean record at all;
* every clean invoice is emailed (``email_deliveries`` ``sent``) and no email is
  sent twice (one message per Message-ID in the sink's Maildir).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.adapters.maildir import count_by_header
from streams.domain.codec import encode
from streams.domain.events import Envelope, InvoiceIssued
from streams.email.sender import ALLOWED_TYPES, invoices_dlq_topic
from tests.fuzz.harness import (
    check_dead_letters,
    dead_letters,
    partition_lags,
    produce,
    refused,
    wait_until,
)
from tests.fuzz.records import FuzzRecord, generate, invoice_record
from tests.support.pipeline import Pipeline

#: Generated invoice-topic records per run (the account-events test carries the 10,000).
RECORDS = int(os.environ.get("FUZZ_EMAIL_RECORDS", "3000"))
CLEAN = 60


def clean_invoices(unique: str, rng: random.Random) -> list[tuple[str, FuzzRecord]]:
    """``CLEAN`` valid ``invoice.issued`` records with a non-zero total: (customer, record)."""
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
            (customer, FuzzRecord(encoded.key, encoded.value, encoded.headers, "clean invoice"))
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
    tagged = [(r, False) for r in generated] + [(r, True) for _c, r in clean]
    rng.shuffle(tagged)
    records = [r for r, _ in tagged]

    coords = produce(p.settings.kafka, p.invoices_topic, records)
    bad = {
        at: record
        for at, (record, is_clean) in zip(coords, tagged, strict=True)
        if not is_clean and refused(record, ALLOWED_TYPES) is not None
    }
    clean_at = {at for at, (_r, is_clean) in zip(coords, tagged, strict=True) if is_clean}
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

    kinds = check_dead_letters(
        dead_letters(p.settings, invoices_dlq_topic(p.settings)), p.invoices_topic, bad, clean_at
    )
    print(f"fuzz(email): dead letters by kind {kinds}")

    wanted = {customer for customer, _r in clean}
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
