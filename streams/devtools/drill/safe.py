"""``invoicing drill --mode safe``: the pipeline itself, under the incident's conditions.

Same customers (the seed's), same number of workers, same tax latencies as the
naive run, in an isolated sandbox on the real stack
(:func:`streams.devtools.sandbox.pipeline.isolated_pipeline`: own database, topics, consumer
groups, Debezium connector, SMTP sink and fake tax service):

1. produce every customer's ``customer.upserted`` and ``usage.recorded`` events
   (deterministic ids) to the sandbox's ``billing.account-events.v1``;
2. start ``config.workers`` invoicing worker processes and one email sender,
   with ``max.poll.interval.ms`` shorter than the longest invoice job (the
   consumer-group membership is the lease here; the worker keeps it by polling
   while the job runs);
3. wait until every partition is claimed, then ``close-period`` (under its
   Redis lease) sends one close marker per customer;
4. wait until every customer has an invoice and every invoice its email;
5. count from the database (``invoices``), the SMTP sink's Maildir (by
   Message-ID and X-Invoice-Id), the tax service's request records and the
   workers' logs ("write refused by fencing", "partition lost while a job was
   in flight", "invoiced … (N s)").
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
from confluent_kafka import KafkaException, Producer

from streams.apps.importers.close_period import ClosePeriodRun
from streams.core.domain.codec import encode
from streams.devtools.drill import DrillError
from streams.devtools.drill.config import DrillConfig
from streams.devtools.drill.customers import DrillCustomer, generate_customers, usage_events
from streams.devtools.drill.report import DrillReport, duplicate_counts, spread
from streams.devtools.sandbox.pipeline import Pipeline, isolated_pipeline
from streams.devtools.stack.maildir import count_by_header
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

FENCING_LINE = "write refused by fencing"
LOST_LINE = "partition lost while a job was in flight"
_JOB_SECONDS = re.compile(r" invoiced (\S+) \S+: \S+ .*\((\d+(?:\.\d+)?)s\)$", re.MULTILINE)


def run_safe(
    settings: Settings,
    config: DrillConfig,
    workdir: Path,
    *,
    run_tag: str,
    producer: Callable[[Settings], Producer],
    close_period: ClosePeriodRun,
    progress: Callable[[str], None] | None = None,
) -> DrillReport:
    """Run the pipeline on the seed's customers and count what it did.

    ``producer`` builds the producer of the usage events and ``close_period`` runs
    close-period, each for the sandbox's settings (the composition root wires them:
    :func:`streams.bootstrap.drill_clients`).

    Raises:
        DrillError: a worker died, or the run did not finish in ``config.timeout_s``.
        streams.apps.importers.ImporterError: close-period failed (Kafka, Redis or the database).
    """
    say = progress or (lambda _msg: None)
    began = time.monotonic()
    customers = generate_customers(config, run_tag)
    report = DrillReport(
        mode="safe",
        seed=config.seed,
        run_tag=run_tag,
        period=config.period,
        customers=len(customers),
        large_customers=sum(1 for c in customers if c.large),
        workers=config.workers,
        lease=(
            f"max.poll.interval {config.max_poll_interval_ms / 1000:g} s, "
            f"session {config.session_timeout_ms / 1000:g} s"
        ),
        workdir=str(workdir),
        sources={
            "invoices": "invoices table",
            "duplicate_invoices": "invoices per customer",
            "missing": "invoices table",
            "emails": "SMTP Maildir",
            "duplicate_emails": "Maildir, per Message-ID and X-Invoice-Id",
            "unemailed": "Maildir vs invoices",
            "fencing_refusals": f'worker logs: "{FENCING_LINE}"',
            "leases_lost": f'worker logs: "{LOST_LINE}"',
            "foreign_lock_deletes": "none: no lock to delete",
            "tax_requests": "tax service request records",
            "duplicate_tax_commits": "committed keys beyond one per document",
            "longest_job_s": 'worker logs: "invoiced … (N s)"',
            "wall_s": "workers start → all invoiced and emailed",
        },
    )
    counted = False
    try:
        with isolated_pipeline(
            settings,
            f"drill{run_tag}",
            workdir,
            max_poll_interval_ms=config.max_poll_interval_ms,
            session_timeout_ms=config.session_timeout_ms,
        ) as p:
            _run(p, report, customers, config, began, say, producer(p.settings), close_period)
            counted = True
    except (psycopg.Error, httpx.HTTPError, KafkaException) as exc:
        if not counted:
            raise
        # The counts are taken; a sandbox that cannot be torn down does not change them.
        say(f"safe: tearing the sandbox down failed: {exc}")
    return report


def _run(
    p: Pipeline,
    report: DrillReport,
    customers: list[DrillCustomer],
    config: DrillConfig,
    began: float,
    say: Callable[[str], None],
    producer: Producer,
    close_period: ClosePeriodRun,
) -> None:
    """Steps 1-5 of the module docstring, inside the sandbox."""
    knobs = config.tax.model_dump()
    if knobs.get("seed") is None:
        knobs["seed"] = config.seed
    p.tax.admin.configure(**knobs)
    lines = _produce(p, producer, customers, config.period)
    report.setup_s = time.monotonic() - began
    say(
        f"safe: {len(customers)} customers, {lines} usage events produced; "
        f"starting {config.workers} invoicing workers and an email sender"
    )
    started = time.monotonic()
    p.workers.start("invoicing", config.workers)
    p.workers.start("email", 1)
    _wait_claimed(p, min(config.workers, ACCOUNT_EVENTS.partitions), config.timeout_s)
    say(
        f"safe: {time.monotonic() - started:.0f} s: every partition claimed; closing {config.period}"
    )
    close_period(config.period, p.settings, progress=False)
    _wait_done(p, customers, config, started, say)
    report.wall_s = time.monotonic() - started
    _count(report, p, customers)


def _produce(p: Pipeline, producer: Producer, customers: list[DrillCustomer], period: str) -> int:
    produced = 0
    for customer in customers:
        for envelope in usage_events(customer, period):
            record = encode(envelope)
            headers: list[tuple[str, str | bytes | None]] = list(record.headers)
            while True:
                try:
                    producer.produce(p.topic, key=record.key, value=record.value, headers=headers)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(0.5)
            produced += 1
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise DrillError(f"{left} usage events were not delivered to {p.topic}")
    return produced


def _dead_workers(p: Pipeline) -> list[str]:
    return [w.name for w in p.workers.processes if w.process.poll() is not None]


def _wait_claimed(p: Pipeline, members: int, timeout_s: float) -> None:
    """Every partition's fence row names one of ``members`` distinct members (after the
    join rebalances settle, each row holds its current owner's claim)."""
    deadline = time.monotonic() + timeout_s
    with p.connect() as conn:
        while time.monotonic() < deadline:
            claimed = conn.execute(
                "SELECT count(*), count(DISTINCT member_id) FROM partition_fences "
                "WHERE group_id = %s AND topic = %s",
                (p.settings.worker.invoicing_group, p.topic),
            ).fetchone()
            if claimed is not None and tuple(int(n) for n in claimed) == (
                ACCOUNT_EVENTS.partitions,
                members,
            ):
                return
            if dead := _dead_workers(p):
                raise DrillError(f"workers died: {dead} (logs in {p.workdir / 'logs'})")
            time.sleep(0.3)
    raise DrillError(f"partitions not claimed by {members} workers in {timeout_s:.0f} s")


def _wait_done(
    p: Pipeline,
    customers: list[DrillCustomer],
    config: DrillConfig,
    started: float,
    say: Callable[[str], None],
) -> None:
    ids = [c.customer_id for c in customers]
    last = time.monotonic()
    counts = (0, 0)
    with p.connect() as conn:
        while time.monotonic() - started < config.timeout_s:
            row = conn.execute(
                """
                SELECT count(DISTINCT i.customer_id),
                       count(DISTINCT i.customer_id) FILTER (WHERE EXISTS (
                           SELECT 1 FROM email_deliveries d
                            WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped')))
                  FROM invoices i
                 WHERE i.billing_period = %s AND i.customer_id = ANY(%s)
                """,
                (config.period, ids),
            ).fetchone()
            assert row is not None
            invoiced, emailed = row
            counts = (int(invoiced), int(emailed))
            if counts == (len(ids), len(ids)):
                return
            if dead := _dead_workers(p):
                raise DrillError(f"workers died: {dead} (logs in {p.workdir / 'logs'})")
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                say(
                    f"safe: {last - started:.0f} s: {counts[0]}/{len(ids)} invoiced, "
                    f"{counts[1]} emailed"
                )
            time.sleep(0.5)
    raise DrillError(
        f"after {config.timeout_s:.0f} s {counts[0]}/{len(ids)} customers invoiced and "
        f"{counts[1]} emailed (logs in {p.workdir / 'logs'})"
    )


def _logs(p: Pipeline) -> str:
    return "\n".join(
        w.log.read_text(errors="replace")
        for w in p.workers.processes
        if w.kind == "invoicing" and w.log.exists()
    )


def _count(report: DrillReport, p: Pipeline, customers: list[DrillCustomer]) -> None:
    ids = [c.customer_id for c in customers]
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, invoice_id::text, total, line_count FROM invoices "
            "WHERE billing_period = %s AND customer_id = ANY(%s)",
            (report.period, ids),
        ).fetchall()
    per_customer: Counter[str] = Counter(str(customer_id) for customer_id, _, _, _ in rows)
    report.invoices = len(rows)
    report.duplicate_invoices, report.customers_invoiced_twice, report.customers_invoiced_3_plus = (
        duplicate_counts(dict(per_customer))
    )
    report.missing = len(set(ids) - set(per_customer))

    # The email sender marks a row 'sent' once SMTP accepted the message: the sink has it.
    by_message_id = count_by_header(p.maildir, "Message-ID")
    by_invoice = count_by_header(p.maildir, "X-Invoice-Id")
    report.emails = sum(by_message_id.values())
    report.duplicate_emails = max(
        duplicate_counts(by_message_id)[0], duplicate_counts(by_invoice)[0]
    )
    report.unemailed = len(
        {str(invoice_id) for _, invoice_id, total, _ in rows if total != 0} - set(by_invoice)
    )

    logs = _logs(p)
    report.fencing_refusals = logs.count(FENCING_LINE)
    report.leases_lost = logs.count(LOST_LINE)
    jobs = [(customer, float(s)) for customer, s in _JOB_SECONDS.findall(logs)]
    large = {c.customer_id for c in customers if c.large}
    report.longest_job_s = max((s for _, s in jobs), default=0.0)
    report.large_job_s = spread([s for customer, s in jobs if customer in large])

    records = p.tax.admin.requests()
    report.tax_requests = len(records)
    committed: Counter[str] = Counter(
        r.idempotency_key or "" for r in records if r.commit and r.outcome in ("ok", "timeout")
    )
    expected = {
        f"{invoice_id}:r1:{i}"
        for _, invoice_id, _, line_count in rows
        for i in range(max(1, math.ceil(int(line_count) / p.settings.tax.max_lines_per_request)))
    }
    report.duplicate_tax_commits = sum(n - 1 for n in committed.values()) + len(
        set(committed) - expected
    )
