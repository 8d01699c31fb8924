"""THE DESIGN THAT FAILED (docs/design.md "The incident"). A reproduction for the incident drill —
never use it.

Nothing in the pipeline imports this module (``tests/unit/test_drill.py``
checks); only :mod:`streams.devtools.drill.run` runs it, for ``invoicing drill --mode naive``.

What the month-end run did, and this module does again, on purpose:

1. Eight workers share a queue of the customers to invoice (a Redis list). A
   worker looks at the next customer (``LMOVE queue queue LEFT RIGHT``: the
   customer stays queued until its invoice is saved) and takes a **lock with an
   expiry**: ``SET lock:<customer> <token> NX PX <ttl>`` (``EX`` in production;
   ``PX`` here so that the compressed drill can use sub-second TTLs). A lock
   held by someone else means "busy: retry later". The lock is never renewed.
2. It reads the customer's usage lines and calls the tax service **once per
   line** (a committed document per line, each with a new idempotency key).
3. It saves the invoice **without a unique key** (``naive_invoices`` has only a
   serial id), sends the email **straight from the worker** through SMTP (a
   random Message-ID), takes the customer off the queue, and releases the lock
   with a plain **DEL** — not compare-and-delete — so it deletes whoever's lock
   is there by then.

A large customer's job outlives its lock; the next worker that comes round to
the customer finds it unlocked and still queued, and starts again. Both save,
both email. That is the incident: customers invoiced two or three times.

The drill harness below the design (set-up, instrumentation, counting) is not
part of the failed design: it records, per job, whether the lock was still the
worker's when it released it (``GETDEL`` returns the holder it deleted, which
is what a plain ``DEL`` does, plus the answer), and counts everything from the
database, the SMTP sink's Maildir and the tax service afterwards.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import smtplib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import redis
from psycopg import sql

from streams.core.domain.money import round_money
from streams.devtools.drill import DrillError
from streams.devtools.drill.config import DrillConfig
from streams.devtools.drill.customers import CURRENCY, DrillCustomer, generate_customers
from streams.devtools.drill.report import DrillReport, duplicate_counts, spread
from streams.devtools.sandbox.smtp import running_smtp_sink
from streams.devtools.stack.fake_tax import running_fake_tax
from streams.devtools.stack.maildir import count_by_header
from streams.settings import Settings

log = logging.getLogger("streams.devtools.drill.naive")

#: Schema of the naive run's own database. Note what is missing: no unique key on
#: (customer, period), no outbox, no fence. ``naive_jobs`` is drill instrumentation.
SCHEMA = """
CREATE TABLE naive_customers (
    customer_id text NOT NULL,
    name        text NOT NULL,
    email       text NOT NULL
);
CREATE TABLE naive_usage (
    customer_id text NOT NULL,
    period      text NOT NULL,
    line_id     text NOT NULL,
    amount      numeric NOT NULL,
    region_id   text
);
CREATE INDEX naive_usage_customer ON naive_usage (customer_id, period);
CREATE TABLE naive_invoices (
    id          serial PRIMARY KEY,
    customer_id text NOT NULL,
    period      text NOT NULL,
    line_count  integer NOT NULL,
    subtotal    numeric NOT NULL,
    tax         numeric NOT NULL,
    total       numeric NOT NULL,
    worker      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE naive_emails (
    id          serial PRIMARY KEY,
    invoice_id  integer NOT NULL,
    customer_id text NOT NULL,
    period      text NOT NULL,
    message_id  text NOT NULL,
    worker      text NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE naive_jobs (
    id                   serial PRIMARY KEY,
    worker               text NOT NULL,
    customer_id          text NOT NULL,
    seconds              double precision NOT NULL,
    outcome              text NOT NULL,
    lock_lost            boolean NOT NULL,
    deleted_foreign_lock boolean NOT NULL
);
"""

#: A worker that finds a lock held waits this long before it looks at the next customer.
RETRY_DELAY_S = 0.05


# =========================================================================== THE FAILED DESIGN


@dataclass(frozen=True)
class NaiveContext:
    """What every naive worker shares: the database, Redis keys, tax URL, SMTP port."""

    dsn: str
    redis: redis.Redis
    queue_key: str
    lock_prefix: str
    lock_ttl_s: float
    tax_url: str
    smtp_port: int
    period: str
    stop: threading.Event


class NaiveWorker(threading.Thread):
    """One month-end worker of the failed design (see the module docstring)."""

    def __init__(self, name: str, ctx: NaiveContext) -> None:
        super().__init__(name=name, daemon=True)
        self.ctx = ctx
        self.error: BaseException | None = None
        self.jobs = 0

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the harness, which fails the run
            log.exception("naive worker %s died", self.name)
            self.error = exc

    def _loop(self) -> None:
        ctx = self.ctx
        url = urlsplit(ctx.tax_url)
        # http.client with keep-alive: the cheapest client, so that the drill's clock is
        # the tax service's latency rather than Python's per-request overhead.
        tax = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
        with contextlib.closing(tax), psycopg.connect(ctx.dsn, autocommit=True) as conn:
            while not ctx.stop.is_set():
                raw = ctx.redis.lmove(ctx.queue_key, ctx.queue_key, "LEFT", "RIGHT")
                if raw is None:
                    return  # the queue is empty: every customer was invoiced (at least once)
                customer_id = raw.decode() if isinstance(raw, bytes) else str(raw)
                lock_key = ctx.lock_prefix + customer_id
                token = f"{self.name}:{uuid.uuid4().hex}"
                # The lock with an expiry, never renewed.
                if not ctx.redis.set(lock_key, token, nx=True, px=int(ctx.lock_ttl_s * 1000)):
                    time.sleep(RETRY_DELAY_S)  # busy: someone else is invoicing it; retry later
                    continue
                started = time.monotonic()
                outcome = "invoiced"
                try:
                    self._invoice(conn, tax, customer_id)
                    # Done: off the queue.
                    ctx.redis.lrem(ctx.queue_key, 0, customer_id)
                except (http.client.HTTPException, smtplib.SMTPException, OSError) as exc:
                    outcome = f"failed: {exc}"
                    log.warning("naive job for %s failed: %s", customer_id, exc)
                # The release: a plain DEL of whatever lock is there now. (GETDEL deletes
                # exactly as DEL does; the value it returns is for the drill's counts.)
                holder = ctx.redis.getdel(lock_key)
                self.jobs += 1
                _record_job(
                    conn, self.name, customer_id, time.monotonic() - started, outcome, token, holder
                )

    def _invoice(
        self, conn: psycopg.Connection[Any], tax: http.client.HTTPConnection, customer_id: str
    ) -> None:
        ctx = self.ctx
        customer = conn.execute(
            "SELECT name, email FROM naive_customers WHERE customer_id = %s", (customer_id,)
        ).fetchone()
        if customer is None:
            raise DrillError(f"naive: unknown customer {customer_id}")
        lines = conn.execute(
            "SELECT line_id, amount, region_id FROM naive_usage "
            "WHERE customer_id = %s AND period = %s ORDER BY line_id",
            (customer_id, ctx.period),
        ).fetchall()
        subtotal = Decimal(0)
        tax_total = Decimal(0)
        for line_id, amount, region_id in lines:  # the tax service, once per line
            subtotal += amount
            tax_total += _tax_one_line(tax, customer_id, line_id, amount, region_id)
        subtotal = round_money(subtotal, CURRENCY)
        tax_total = round_money(tax_total, CURRENCY)
        total = subtotal + tax_total
        # Saved without a unique key.
        row = conn.execute(
            "INSERT INTO naive_invoices (customer_id, period, line_count, subtotal, tax, total, worker) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (customer_id, ctx.period, len(lines), subtotal, tax_total, total, self.name),
        ).fetchone()
        assert row is not None
        (new_id,) = row
        invoice_id = int(new_id)
        # Emailed straight from the worker.
        message_id = _send_email(
            ctx.smtp_port, customer_id, customer[0], customer[1], ctx.period, invoice_id, total
        )
        conn.execute(
            "INSERT INTO naive_emails (invoice_id, customer_id, period, message_id, worker) "
            "VALUES (%s, %s, %s, %s, %s)",
            (invoice_id, customer_id, ctx.period, message_id, self.name),
        )


def _tax_one_line(
    tax: http.client.HTTPConnection,
    customer_id: str,
    line_id: str,
    amount: Decimal,
    region_id: str | None,
) -> Decimal:
    """One committed tax document for one line, under a new key each time."""
    body = json.dumps(
        {
            "idempotency_key": f"naive:{customer_id}:{line_id}:{uuid.uuid4().hex}",
            "customer_id": customer_id,
            "currency": CURRENCY,
            "commit": True,
            "lines": [
                {
                    "line_id": line_id,
                    "amount": format(amount, "f"),
                    "region_id": region_id,
                    "tax_code": None,
                }
            ],
        }
    )
    tax.request("POST", "/v1/documents", body=body, headers={"content-type": "application/json"})
    response = tax.getresponse()
    data = response.read()
    if response.status != 200:
        raise http.client.HTTPException(f"tax service answered {response.status}: {data[:200]!r}")
    return Decimal(json.loads(data)["lines"][0]["tax"])


def _send_email(
    port: int, customer_id: str, name: str, to: str, period: str, invoice_id: int, total: Decimal
) -> str:
    message = EmailMessage()
    message_id = make_msgid(domain="naive.drill.example")
    message["From"] = "billing@naive.drill.example"
    message["To"] = to
    message["Subject"] = f"Your invoice {invoice_id} for {period}"
    message["Message-ID"] = message_id
    message["X-Customer-Id"] = customer_id
    message["X-Billing-Period"] = period
    message["X-Naive-Invoice-Id"] = str(invoice_id)
    message.set_content(
        f"Dear {name},\n\nyour invoice {invoice_id} for {period}: {total} {CURRENCY}.\n"
    )
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.send_message(message)
    return message_id


# =========================================================================== drill harness


def _record_job(
    conn: psycopg.Connection[Any],
    worker: str,
    customer_id: str,
    seconds: float,
    outcome: str,
    token: str,
    holder: bytes | str | None,
) -> None:
    held = holder.decode() if isinstance(holder, bytes) else holder
    conn.execute(
        "INSERT INTO naive_jobs (worker, customer_id, seconds, outcome, lock_lost, deleted_foreign_lock) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (
            worker,
            customer_id,
            seconds,
            outcome[:500],
            held != token,
            held is not None and held != token,
        ),
    )


@contextlib.contextmanager
def _database(settings: Settings, name: str) -> Iterator[str]:
    """Create the run's own database (dropped afterwards); yields its DSN. A throwaway of
    the design that failed, which had no roles: the provisioner login creates it, owns
    it and is what the naive workers connect as."""
    admin_dsn = settings.postgres.dsn("provisioner")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = settings.postgres.dsn("provisioner", database=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        yield dsn
    finally:
        try:
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        except psycopg.Error as exc:  # the counts are taken: say so, keep them
            log.warning("could not drop the naive database %s: %s", name, exc)


def _load(dsn: str, customers: list[DrillCustomer], period: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.cursor().copy(
            "COPY naive_customers (customer_id, name, email) FROM STDIN"
        ) as copy:
            for c in customers:
                copy.write_row((c.customer_id, c.name, c.email))
        with conn.cursor().copy(
            "COPY naive_usage (customer_id, period, line_id, amount, region_id) FROM STDIN"
        ) as copy:
            for c in customers:
                for line in c.lines:
                    copy.write_row(
                        (c.customer_id, period, line.line_id, line.amount, line.region_id)
                    )


def run_naive(
    settings: Settings,
    config: DrillConfig,
    workdir: Path,
    *,
    run_tag: str,
    redis_conn: redis.Redis,
    progress: Callable[[str], None] | None = None,
) -> DrillReport:
    """Run the failed design on the seed's customers and count what it did.

    Creates (and drops) the database ``drill_naive_<seed>_<tag>``, a fake tax service
    with ``config.tax`` and an SMTP sink (files in ``workdir``), and Redis keys under
    ``drill:naive:<tag>:`` through ``redis_conn`` (deleted afterwards; the client is
    closed at the end). Like the sandbox, the run connects to the database it
    created by itself (one connection per worker thread, as the failed design did).

    Raises:
        DrillError: a worker died, or the run did not finish in ``config.timeout_s``.
    """
    say = progress or (lambda _msg: None)
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    customers = generate_customers(config, run_tag)
    total_lines = sum(len(c.lines) for c in customers)
    report = DrillReport(
        mode="naive",
        seed=config.seed,
        run_tag=run_tag,
        period=config.period,
        customers=len(customers),
        large_customers=sum(1 for c in customers if c.large),
        workers=config.workers,
        lease=f"lock TTL {config.lock_ttl_s:g} s (SET NX PX, never renewed)",
        workdir=str(workdir),
        sources={
            "invoices": "naive_invoices",
            "duplicate_invoices": "naive_invoices per customer",
            "missing": "naive_invoices",
            "emails": "SMTP Maildir",
            "duplicate_emails": "Maildir, per X-Customer-Id",
            "unemailed": "Maildir vs naive_invoices",
            "fencing_refusals": "none: no fencing in this design",
            "leases_lost": "naive_jobs: lock not ours at release",
            "foreign_lock_deletes": "naive_jobs: DEL removed another's lock",
            "tax_requests": "tax service /health",
            "duplicate_tax_commits": "tax documents - usage lines",
            "longest_job_s": "naive_jobs",
            "wall_s": "workers start → queue empty",
        },
    )
    database = f"drill_naive_{config.seed}_{run_tag}"
    prefix = f"drill:naive:{run_tag}:"
    client = redis_conn
    tax_config = (
        config.tax
        if config.tax.seed is not None
        else config.tax.model_copy(update={"seed": config.seed})
    )
    try:
        with (
            _database(settings, database) as dsn,
            running_fake_tax(workdir / "tax", config=tax_config) as tax,
            running_smtp_sink(workdir) as (smtp_port, maildir),
        ):
            _load(dsn, customers, config.period)
            client.delete(prefix + "queue")
            client.rpush(prefix + "queue", *[c.customer_id for c in customers])
            stop = threading.Event()
            ctx = NaiveContext(
                dsn=dsn,
                redis=client,
                queue_key=prefix + "queue",
                lock_prefix=prefix + "lock:",
                lock_ttl_s=config.lock_ttl_s,
                tax_url=tax.url,
                smtp_port=smtp_port,
                period=config.period,
                stop=stop,
            )
            workers = [NaiveWorker(f"naive-{n + 1}", ctx) for n in range(config.workers)]
            report.setup_s = time.monotonic() - began
            say(
                f"naive: {len(customers)} customers, {total_lines} usage lines, {config.workers} workers"
            )
            started = time.monotonic()
            for worker in workers:
                worker.start()
            _wait_workers(workers, dsn, len(customers), started, config.timeout_s, stop, say)
            report.wall_s = time.monotonic() - started
            _count(
                report,
                dsn,
                maildir,
                tax.admin.health(),
                {c.customer_id for c in customers},
                {c.customer_id for c in customers if c.large},
                total_lines,
            )
    finally:
        try:
            for key in client.scan_iter(match=prefix + "*", count=1000):
                client.delete(key)
        except redis.RedisError as exc:  # locks expire on their own; the queue is small
            log.warning("could not delete the drill's Redis keys %s*: %s", prefix, exc)
        client.close()
    return report


def _wait_workers(
    workers: list[NaiveWorker],
    dsn: str,
    customers: int,
    started: float,
    timeout_s: float,
    stop: threading.Event,
    say: Callable[[str], None],
) -> None:
    last_report = started
    with psycopg.connect(dsn, autocommit=True) as conn:
        while any(w.is_alive() for w in workers):
            dead = [w for w in workers if w.error is not None]
            if dead:
                stop.set()
                raise DrillError(f"naive worker {dead[0].name} died: {dead[0].error!r}")
            if time.monotonic() - started > timeout_s:
                stop.set()
                raise DrillError(f"the naive run did not finish in {timeout_s:.0f} s")
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                progress = conn.execute(
                    "SELECT count(DISTINCT customer_id), count(*) FROM naive_invoices"
                ).fetchone()
                assert progress is not None
                invoiced, invoices = progress
                say(
                    f"naive: {time.monotonic() - started:.0f} s: {invoiced}/{customers} customers "
                    f"invoiced, {invoices} invoices"
                )
            time.sleep(0.2)
    dead = [w for w in workers if w.error is not None]
    if dead:
        raise DrillError(f"naive worker {dead[0].name} died: {dead[0].error!r}")


def _count(
    report: DrillReport,
    dsn: str,
    maildir: Path,
    tax_health: dict[str, Any],
    customers: set[str],
    large: set[str],
    total_lines: int,
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        per_customer = {
            str(customer_id): int(invoices)
            for customer_id, invoices in conn.execute(
                "SELECT customer_id, count(*) FROM naive_invoices GROUP BY customer_id"
            ).fetchall()
        }
        jobs = conn.execute(
            "SELECT count(*) FILTER (WHERE lock_lost), count(*) FILTER (WHERE deleted_foreign_lock), "
            "coalesce(max(seconds), 0) FROM naive_jobs"
        ).fetchone()
        large_jobs = [
            float(seconds)
            for (seconds,) in conn.execute(
                "SELECT seconds FROM naive_jobs WHERE outcome = 'invoiced' AND customer_id = ANY(%s)",
                (sorted(large),),
            ).fetchall()
        ]
    assert jobs is not None
    report.invoices = sum(per_customer.values())
    report.duplicate_invoices, report.customers_invoiced_twice, report.customers_invoiced_3_plus = (
        duplicate_counts(per_customer)
    )
    report.missing = report.customers - len(per_customer)
    emails = {
        customer: n
        for customer, n in count_by_header(maildir, "X-Customer-Id").items()
        if customer in customers
    }
    report.emails = sum(emails.values())
    report.duplicate_emails = duplicate_counts(emails)[0]
    report.unemailed = len(set(per_customer) - set(emails))
    report.leases_lost = int(jobs[0])
    report.foreign_lock_deletes = int(jobs[1])
    report.longest_job_s = float(jobs[2])
    report.large_job_s = spread(large_jobs)
    report.tax_requests = int(tax_health["requests"])
    report.duplicate_tax_commits = int(tax_health["documents"]) - total_lines
