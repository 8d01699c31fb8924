"""The chaos harness can fail: a clean run passes :func:`check_invariants`, and each
kind of violation, planted by hand afterwards, is caught and named (with the seed)."""

from __future__ import annotations

import mailbox
import re
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from streams.adapters.kafka import make_producer
from streams.devtools.stack.maildir import list_messages
from streams.topics import INVOICES_DLQ
from tests.chaos.harness import (
    SEED_ENV,
    check_invariants,
    close_all,
    generate_workload,
    produce_workload,
    wait_settled,
    write_report,
)
from tests.support.pipeline import Pipeline


@pytest.mark.timeout(180)
def test_invariant_checks_catch_planted_violations(
    pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=8, events_per_customer=3)
    produce_workload(p, w)
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    close_all(p, w)
    wait_settled(p, w, timeout_s=120)
    write_report(w, "harness self-test, clean run", check_invariants(p, w))
    p.workers.stop()

    def caught(pattern: str) -> None:
        with pytest.raises(AssertionError, match=pattern) as info:
            check_invariants(p, w)
        assert f"{SEED_ENV}={chaos_seed}" in str(info.value)  # names the seed and the rerun

    with p.connect() as conn:
        # Planting violations edits issued documents, which migration 0006's triggers refuse
        # to every role: the owner lifts them in this sandbox's database first, the way a
        # reviewed data fix would (DDL, visible).
        conn.execute("ALTER TABLE invoices DISABLE TRIGGER invoices_immutable")
        conn.execute("ALTER TABLE invoice_lines DISABLE TRIGGER invoice_lines_immutable")
        inv_id, part, gen, issued_at = conn.execute(
            "SELECT invoice_id::text, source_partition, fence_generation, issued_at "
            "FROM invoices WHERE total <> 0 ORDER BY invoice_id LIMIT 1"
        ).fetchone()  # type: ignore[misc]

        # (3) a usage event counted with another amount than the workload produced
        original = w.usage[0]
        w.usage[0] = replace(original, amount=original.amount + Decimal("0.01"))
        caught("invariant 3")
        w.usage[0] = original

        # (1) a pair left without its issued invoice
        conn.execute("UPDATE invoices SET status = 'voided' WHERE invoice_id = %s", (inv_id,))
        caught("invariant 1")
        conn.execute("UPDATE invoices SET status = 'issued' WHERE invoice_id = %s", (inv_id,))

        # (6) a line that does not trace to where its event was produced
        conn.execute(
            "UPDATE invoice_lines SET source_offset = source_offset + 1000 "
            "WHERE invoice_id = %s AND line_no = 1",
            (inv_id,),
        )
        caught("invariant 6")
        conn.execute(
            "UPDATE invoice_lines SET source_offset = source_offset - 1000 "
            "WHERE invoice_id = %s AND line_no = 1",
            (inv_id,),
        )

        # (4) an invoice written under a token nobody claimed
        member = conn.execute(
            "SELECT fence_member FROM invoices WHERE invoice_id = %s", (inv_id,)
        ).fetchone()
        conn.execute(
            "UPDATE invoices SET fence_member = 'intruder' WHERE invoice_id = %s", (inv_id,)
        )
        caught("invariant 4")
        conn.execute(
            "UPDATE invoices SET fence_member = %s WHERE invoice_id = %s",
            (member[0] if member else None, inv_id),
        )

    # (4) an invoice issued after a later generation claimed its partition
    worker_log = next(x.log for x in p.workers.processes if x.name == "invoicing-1")
    clean_log = worker_log.read_text()
    when = (issued_at - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    worker_log.write_text(
        clean_log
        + f"{when}Z INFO streams.apps.invoicing.worker: claimed {p.topic}[{part}] at generation "
        f"{gen + 100} as someone-else\n"
    )
    caught("invariant 4")
    worker_log.write_text(clean_log)

    # (2) the same invoice emailed under a second Message-ID
    box = mailbox.Maildir(p.maildir, create=False)
    message = next(m for m in list_messages(p.maildir) if m["X-Invoice-Id"] == inv_id)
    raw = re.sub(rb"(?m)^Message-ID: <", b"Message-ID: <other-", message.as_bytes(), count=1)
    key = box.add(raw)
    caught("invariant 2")
    box.remove(key)

    # A copy under the same Message-ID: a violation, unless the scenario can crash the
    # sender between send and mark (then allowed, and reported).
    key = box.add(message.as_bytes())
    caught("invariant 2")
    report = check_invariants(p, w, max_email_copies=2)
    assert report.email_copies[str(message["Message-ID"]).strip()] == 2, report.summary()
    # ... but only for the one email in flight: a second invoice with two copies is caught.
    second = next(
        m
        for m in list_messages(p.maildir)
        if m["X-Invoice-Id"] != inv_id and m["Message-ID"] != message["Message-ID"]
    )
    key2 = box.add(second.as_bytes())
    with pytest.raises(AssertionError, match="2 invoices emailed more than once"):
        check_invariants(p, w, max_email_copies=2)
    box.remove(key2)
    box.remove(key)
    check_invariants(p, w)

    # (5) a good record dead-lettered in a scenario without poison
    producer = make_producer(p.settings.kafka)
    producer.produce(p.dlq_topic, key=b"k", value=b"v", headers=[("dlq.reason", b"planted")])
    assert producer.flush(10) == 0
    caught("dead-lettered in a scenario without poison")

    # (5) an invoice event dead-lettered by the email sender (last: it cannot be undone)
    producer.produce(p.settings.kafka.topic_prefix + INVOICES_DLQ.name, key=b"k", value=b"v")
    assert producer.flush(10) == 0
    caught("dead-lettered by the email sender")
