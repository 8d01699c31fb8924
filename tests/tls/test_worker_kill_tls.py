"""Chaos over the TLS profile: an invoicing worker SIGKILLed in the middle of a close,
every client on TLS with its login and the plaintext listeners off.

Three invoicing workers and one email sender run in a sandbox
(:func:`tests.support.pipeline.isolated_pipeline`) on the TLS stack: Kafka SASL_SSL /
SCRAM-SHA-512, PostgreSQL ``verify-full``, Redis ``rediss://`` with the ACL user, and the
sandbox's SMTP sink with STARTTLS and AUTH required. The fake tax service answers in 5 s,
so when the close's first tax request arrives the worker owning that customer's partition
has its invoice job in flight, before any database commit; that worker is SIGKILLed, the
tax service made fast again, and the survivors take its partitions.

What it proves, on the sandbox's database, Maildir and invoices topic (the chaos
harness's :func:`~tests.chaos.harness.check_invariants`, plus the per-customer counts
below, computed from the workload and not from the pipeline's code):

- each customer has exactly one invoice: one row, one ``INV-…`` number, written by a
  survivor for the killed worker's customer, with the subtotal and tax of the workload;
- each invoice has exactly one outbox row and one ``invoice.issued`` on the topic;
- each customer got exactly one email (one Message-ID, one copy, to its address);
- the killed job's tax document was asked again under the same idempotency key and
  committed once.

The plaintext doors of the same stack are shut (``test_the_plaintext_doors_are_shut``,
tests/tls/test_focus_demo_tls.py), so every write, record and email here went over TLS;
the sandbox's own SMTP sink is checked here to refuse MAIL before STARTTLS.

Runs only when asked (``-m tls``: ``make test-tls``).
"""

from __future__ import annotations

import smtplib
from collections import Counter
from pathlib import Path

import pytest

from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.chaos.harness import (
    assert_tax_once,
    check_invariants,
    close_all,
    first_taxed_customer,
    generate_workload,
    kill_worker,
    member_workers,
    start_run,
    wait_settled,
    write_report,
)
from tests.support.pipeline import isolated_pipeline

pytestmark = pytest.mark.tls

#: The chaos tier's fault timers (tests/chaos/test_worker_faults.py): the broker notices
#: the dead member after 3 s.
MAX_POLL_INTERVAL_MS = 5_000
SESSION_TIMEOUT_MS = 3_000
#: Slow enough that a job is in flight when the kill comes.
SLOW_TAX_S = 5.0
FAST_TAX_S = 0.02


@pytest.mark.timeout(240)
def test_worker_killed_mid_close_issues_and_emails_each_invoice_once(
    tls_settings: Settings, unique: str, tmp_path: Path, chaos_seed: int, rerun: str
) -> None:
    with isolated_pipeline(
        tls_settings,
        unique,
        tmp_path,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    ) as p:
        w = generate_workload(chaos_seed, p.unique, rerun, customers=12, events_per_customer=4)
        workers, owners = start_run(p, w)

        p.tax.admin.configure(base_latency_s=SLOW_TAX_S)
        close_all(p, w)
        customer = first_taxed_customer(p, w)
        victim_name = owners[w.partition_of(customer)]
        victim = next(x for x in workers if x.name == victim_name)
        kill_worker(victim)  # its job waits on the tax answer: no database commit yet
        p.tax.admin.configure(base_latency_s=FAST_TAX_S)
        wait_settled(p, w, timeout_s=120, allow_dead=[victim])
        assert victim.process.returncode == -9, w.msg(f"{victim_name} was not SIGKILLed")

        report = check_invariants(p, w)
        tax = assert_tax_once(p, w)
        write_report(w, "TLS: worker SIGKILLed mid-close, before its database commit", report)
        print(f"tax requests by outcome: {tax}")

        # The emails counted below came through STARTTLS and AUTH: the sandbox's sink
        # refuses a sender that has not done both.
        with smtplib.SMTP(p.settings.smtp.host, p.settings.smtp.port, timeout=5) as conn:
            code, _ = conn.mail("billing@invoicing.example")
        assert code == 530, w.msg(f"the sandbox's SMTP sink took MAIL before STARTTLS ({code})")

        with p.connect() as conn:
            invoices = conn.execute(
                """SELECT i.customer_id, i.invoice_number, i.fence_member,
                          (SELECT count(*) FROM outbox o WHERE o.document_id = i.invoice_id)
                     FROM invoices i"""
            ).fetchall()
        per_customer = Counter(str(row[0]) for row in invoices)
        assert per_customer == Counter(w.customers), w.msg(f"invoices per customer {per_customer}")
        numbers = [str(row[1]) for row in invoices]
        assert len(set(numbers)) == len(w.customers), w.msg(f"invoice numbers {numbers}")
        outbox = {str(row[0]): int(row[3]) for row in invoices}
        assert set(outbox.values()) == {1}, w.msg(f"outbox rows per customer's invoice {outbox}")
        writer = next(member_workers(p).get(str(row[2])) for row in invoices if row[0] == customer)
        assert writer not in (None, victim_name), w.msg(f"{customer} invoiced by {writer}")

        # An invoice of total 0.00 is not emailed (docs/decisions/0080-email-delivery.md).
        period = w.periods[0]
        billed = [
            c for c in w.customers if w.expected_subtotal(c, period) + w.expected_tax(c, period)
        ]
        # The envelope's recipients, as the sink received them (X-RcptTo).
        recipients = Counter(
            rcpt.strip() for m in list_messages(p.maildir) for rcpt in str(m["X-RcptTo"]).split(",")
        )
        addresses = Counter(f"{c}@example.test" for c in billed)
        assert recipients == addresses, w.msg(f"emails per recipient {recipients}")

        keys = [
            r.idempotency_key
            for r in p.tax.admin.requests(kind="document")
            if r.customer_id == customer
        ]
        assert len(keys) >= 2 and len(set(keys)) == 1, w.msg(f"tax keys of {customer}: {keys}")
