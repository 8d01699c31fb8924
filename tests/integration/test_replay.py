"""``invoicing replay``: dry run and apply on the FOCUS sample, end to end, on the real stack.

Each test runs in its own sandbox (database, topics, groups, connector, SMTP
sink, tax service) and first runs the main job on the bundled FOCUS sample:
import, 2 invoicing workers + 1 email sender (processes), close every period,
wait until the 73 invoices are issued and emailed. Then it breaks something
the way production breaks (a lost write, late usage, a concurrent run, a
crash) and checks what the replay reports and writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from typer.testing import CliRunner

from streams import bootstrap
from streams.adapters.lease import DEFAULT_KEY_PREFIX, LeaseBusy
from streams.apps.ops.focus_expected import expected_from_file
from streams.apps.replay import Mode, ReplayReport
from streams.apps.replay import lease_name_for as replay_lease_name
from streams.bootstrap import replay_period, run_close_period, run_import_focus
from streams.core.billing.store.usage import late_usage
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, UsageRecorded, deterministic_id, invoice_id_for
from streams.core.domain.money import round_money
from streams.devtools.demo.run import progress_counts
from streams.devtools.stack.maildir import list_messages
from streams.entrypoints.app import app
from streams.settings import Settings
from tests.support.barriers import plus_sentinel, sentinel_invoice
from tests.support.kafka import ProduceHeaders, wait_for_no_lag
from tests.support.pipeline import Pipeline, isolated_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
EXPECTED = expected_from_file(SAMPLE)
INVOICES = len(EXPECTED.sums)  # 73


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


# --------------------------------------------------------------------------- helpers


def count(p: Pipeline, sql: str, *params: Any) -> int:
    with p.connect() as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def table_counts(p: Pipeline) -> dict[str, int]:
    return {
        table: count(p, f"SELECT count(*) FROM {table}")
        for table in (
            "invoices",
            "invoice_lines",
            "credit_notes",
            "outbox",
            "email_deliveries",
            "usage_lines",
        )
    }


def wait_for(what: str, check: Callable[[], bool], p: Pipeline, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
        assert not dead, f"workers died: {dead}\n{p.worker_logs()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{p.worker_logs()}")


def focus_flow(p: Pipeline, before_close: Callable[[], None] | None = None) -> None:
    """The main job on the FOCUS sample; ``before_close`` runs once all usage is stored."""
    summary = run_import_focus(SAMPLE, p.settings, progress=False)
    assert summary.produced == EXPECTED.rows
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    if before_close is not None:
        wait_for(
            "all usage stored",
            lambda: count(p, "SELECT count(*) FROM usage_lines") == EXPECTED.rows,
            p,
        )
        wait_for_no_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic)
        before_close()
    for period in EXPECTED.periods:
        run_close_period(period, p.settings, progress=False)

    def done() -> bool:
        with p.connect() as conn:
            return progress_counts(conn, EXPECTED) == (INVOICES, INVOICES)

    wait_for(f"{INVOICES} invoices issued and emailed", done, p)


#: The largest line of a (customer, period) whose invoice stays above 0.01 without it, so
#: that both the credit note and the new revision are emailed (zero totals are not).
_VICTIM = """
SELECT u.customer_id, u.billing_period, u.event_id, u.amount
  FROM usage_lines u
  JOIN (SELECT customer_id, billing_period, count(*) AS n, sum(amount) AS s, max(amount) AS m
          FROM usage_lines GROUP BY 1, 2) t USING (customer_id, billing_period)
 WHERE u.amount = t.m AND t.m > 0.01 AND t.s - t.m > 0.01
   AND (%(period)s::text IS NULL OR u.billing_period = %(period)s::text)
   AND NOT (u.customer_id = ANY(%(skip)s))
 ORDER BY t.n DESC, u.customer_id, u.billing_period, u.event_id
 LIMIT 1
"""


def lose_usage_line(
    p: Pipeline, *, period: str | None = None, skip: tuple[str, ...] = ()
) -> tuple[str, str, str, Decimal]:
    """Delete one usage line (a lost write: the worker's row never reached the database).
    Returns (customer, period, event id, amount)."""
    with p.connect() as conn:
        row = conn.execute(_VICTIM, {"period": period, "skip": list(skip)}).fetchone()
        assert row is not None
        conn.execute("DELETE FROM usage_lines WHERE event_id = %s", (row[2],))
    return row[0], row[1], row[2], row[3]


def replay(p: Pipeline, period: str, mode: Mode, **kwargs: Any) -> ReplayReport:
    return replay_period(period, p.settings, mode=mode, progress=False, **kwargs)


def replay_all(p: Pipeline, mode: Mode) -> dict[str, ReplayReport]:
    return {period: replay(p, period, mode) for period in EXPECTED.periods}


def issued_row(p: Pipeline, customer: str, period: str) -> tuple[Any, ...]:
    with p.connect() as conn:
        row = conn.execute(
            "SELECT invoice_id::text, revision, subtotal, tax_total, total, line_count, "
            "supersedes_invoice_id::text FROM invoices "
            "WHERE customer_id = %s AND billing_period = %s AND status = 'issued'",
            (customer, period),
        ).fetchone()
    assert row is not None
    return tuple(row)


def emails_by(p: Pipeline, header: str) -> Counter[str]:
    return Counter(m[header] for m in list_messages(p.maildir) if m[header] is not None)


def wait_emails_settled(p: Pipeline) -> None:
    """Every outbox row's document has a final email_deliveries row (sent or skipped)."""
    wait_for(
        "every outbox document emailed",
        lambda: (
            count(
                p,
                "SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM email_deliveries d "
                "WHERE d.document_id = o.document_id AND d.status IN ('sent', 'skipped') "
                "AND d.event_id = o.id::text)",
            )
            == 0
        ),
        p,
    )


def assert_one_correction(
    p: Pipeline, report: ReplayReport, customer: str, period: str, exact: Decimal
) -> tuple[str, str, str]:
    """The apply issued exactly one credit note and one revision 2 for ``customer``, with
    the exact subtotal; returns (old invoice id, new invoice id, credit note id)."""
    [outcome] = report.differences
    assert (outcome.customer_id, outcome.outcome, outcome.revision) == (customer, "corrected", 2)
    old_id = invoice_id_for(customer, period, 1)
    new_id = invoice_id_for(customer, period, 2)
    assert (outcome.old_invoice_id, outcome.new_invoice_id) == (old_id, new_id)
    row = issued_row(p, customer, period)
    assert row[0] == new_id and row[1] == 2 and row[6] == old_id
    assert row[2] == round_money(exact, "USD")
    with p.connect() as conn:
        old = conn.execute(
            "SELECT status, subtotal, tax_total, total FROM invoices WHERE invoice_id = %s",
            (old_id,),
        ).fetchone()
        note = conn.execute(
            "SELECT credit_note_id::text, credit_note_number, subtotal, tax_total, total "
            "FROM credit_notes WHERE invoice_id = %s",
            (old_id,),
        ).fetchone()
    assert old is not None and note is not None
    assert old[0] == "superseded"
    assert tuple(note[2:]) == tuple(old[1:])  # the credit note cancels the issued amounts
    assert note[0] == outcome.credit_note_id == deterministic_id("credit_note", old_id)
    assert note[1].startswith(f"CN-{period}-")
    return old_id, new_id, note[0]


# --------------------------------------------------------------------------- tests


def test_after_the_focus_flow_a_dry_run_reports_no_differences_and_apply_changes_nothing(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    focus_flow(p)
    before = table_counts(p)
    started = time.monotonic()
    dry = replay_all(p, Mode.DRY_RUN)
    dry_s = time.monotonic() - started
    events = sum(r.events_read for r in dry.values())
    for period, report in dry.items():
        # usage, customers and close markers: the whole topic lies in the window
        assert report.events_read == report.window.total >= EXPECTED.rows + INVOICES
        assert report.differences == [] and report.failed == [] and report.skipped == []
        assert report.unchanged == sum(1 for _, q in EXPECTED.sums if q == period)
        assert report.conflicts == [] and report.invalid == []
        # The replay's own group recorded its progress: committed = the window's end offsets.
        consumer = bootstrap.consumer(p.settings, report.consumer_group)
        try:
            committed = consumer.committed(
                [TopicPartition(p.topic, part) for part in report.window.end], timeout=10
            )
        finally:
            consumer.close()
        for tp in committed:
            if report.window.start[tp.partition] < report.window.end[tp.partition]:
                assert tp.offset == report.window.end[tp.partition]
    started = time.monotonic()
    applied = replay_all(p, Mode.APPLY)
    apply_s = time.monotonic() - started
    assert all(r.differences == [] and r.status == "completed" for r in applied.values())
    assert table_counts(p) == before
    with p.connect() as conn:
        runs = conn.execute(
            "SELECT mode, status, count(*) FROM replay_runs GROUP BY 1, 2 ORDER BY 1"
        ).fetchall()
    n = len(EXPECTED.periods)
    assert runs == [("apply", "completed", n), ("dry_run", "completed", n)]
    print(
        f"\nreplay of the FOCUS sample ({len(EXPECTED.periods)} periods, {events} events re-read): "
        f"dry run {dry_s:.2f}s, apply {apply_s:.2f}s; re-read rates "
        + ", ".join(f"{q}: {r.events_per_s:.0f} events/s" for q, r in dry.items())
    )


def test_a_lost_usage_write_is_reported_then_corrected_once(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    lost: list[tuple[str, str, str, Decimal]] = []
    focus_flow(p, before_close=lambda: lost.append(lose_usage_line(p)))
    [(customer, period, event_id, amount)] = lost
    exact = EXPECTED.sums[(customer, period)]
    old_subtotal = issued_row(p, customer, period)[2]
    assert old_subtotal == round_money(exact - amount, "USD")  # the invoice lacks the line

    # Dry run through the CLI: the table and the JSON report name the customer and amount.
    before = table_counts(p)
    report_path = tmp_path / "dry.json"
    started = time.monotonic()
    result = CliRunner().invoke(
        app,
        ["replay", period, "--dry-run", "--no-progress", "--report", str(report_path)],
        env=p.env,
    )
    dry_s = time.monotonic() - started
    assert result.exit_code == 0, result.output
    document = json.loads(report_path.read_text())
    [difference] = document["differences"]
    assert difference["customer_id"] == customer and difference["outcome"] == "difference"
    diff = difference["difference"]
    assert diff["usage_not_invoiced"] == [
        {
            "event_id": event_id,
            "amount": str(amount),
            "partition": diff["usage_not_invoiced"][0]["partition"],
            "offset": diff["usage_not_invoiced"][0]["offset"],
            "late": False,
            "stored": False,
        }
    ]
    assert diff["invoiced_not_in_usage"] == []
    assert Decimal(diff["recomputed"]["subtotal"]) == round_money(exact, "USD")
    assert Decimal(diff["issued"]["subtotal"]) == old_subtotal
    assert document["summary"]["differences"] == 1
    assert table_counts(p) == before  # a dry run writes nothing to the invoice tables
    emails_before = len(list_messages(p.maildir))

    started = time.monotonic()
    report = replay(p, period, Mode.APPLY)
    apply_s = time.monotonic() - started
    _old_id, new_id, note_id = assert_one_correction(p, report, customer, period, exact)
    after = table_counts(p)
    assert after["invoices"] == before["invoices"] + 1
    assert after["credit_notes"] == before["credit_notes"] + 1 == 1
    assert after["outbox"] == before["outbox"] + 2
    assert after["usage_lines"] == before["usage_lines"] + 1  # the lost write is restored
    with p.connect() as conn:
        line = conn.execute(
            "SELECT source_topic, source_partition, source_offset FROM invoice_lines "
            "WHERE invoice_id = %s AND event_id = %s",
            (new_id, event_id),
        ).fetchone()
    assert line == (
        p.topic,
        diff["usage_not_invoiced"][0]["partition"],
        diff["usage_not_invoiced"][0]["offset"],
    )

    wait_emails_settled(p)
    assert emails_by(p, "X-Credit-Note-Id") == {note_id: 1}
    revisions = Counter(
        (m["X-Invoice-Id"], m["X-Invoice-Revision"])
        for m in list_messages(p.maildir)
        if m["X-Invoice-Revision"] == "2"
    )
    assert revisions == {(new_id, "2"): 1}
    assert len(list_messages(p.maildir)) == emails_before + 2
    after = table_counts(p)
    assert after["email_deliveries"] == before["email_deliveries"] + 2

    # A second apply changes nothing.
    again = replay(p, period, Mode.APPLY)
    assert again.differences == [] and again.failed == []
    # A sentinel invoice through the whole pipeline: once its email is in, anything the
    # second apply would have caused has happened (tests/support/barriers.py).
    sentinel_invoice(p)
    assert table_counts(p) == plus_sentinel(after)
    assert len(list_messages(p.maildir)) == emails_before + 2 + 1
    print(f"\nlost write: dry run {dry_s:.2f}s (CLI), apply {apply_s:.2f}s")


def test_late_usage_is_stored_listed_reported_and_invoiced_by_apply(pipeline: Pipeline) -> None:
    p = pipeline
    focus_flow(p)
    with p.connect() as conn:
        customer, period, invoice_id = conn.execute(
            "SELECT customer_id, billing_period, invoice_id::text FROM invoices "
            "WHERE status = 'issued' AND total > 0 ORDER BY customer_id, billing_period LIMIT 1"
        ).fetchone()  # type: ignore[misc]
        assert late_usage(conn) == []
    late_id = f"late-{p.unique}"
    data = UsageRecorded(
        customer_id=customer,
        billing_period=period,
        amount=Decimal("7.125"),
        currency="USD",
        event_time=datetime(int(period[:4]), int(period[5:]), 28, tzinfo=UTC),
        description="late usage",
        region_id="us-east-1",
    )
    producer = bootstrap.producer(p.settings)
    record = encode(Envelope.wrap(data, id=late_id, source="/tests"))
    producer.produce(p.topic, key=record.key, value=record.value, headers=list(record.headers))
    assert producer.flush(10) == 0
    wait_for(
        "the late usage line stored",
        lambda: count(p, "SELECT count(*) FROM usage_lines WHERE event_id = %s", late_id) == 1,
        p,
    )
    with p.connect() as conn:
        [late] = late_usage(conn)
        assert late_usage(conn, period) == [late]
        assert late_usage(conn, "1999-01") == []
    assert (late.event_id, late.customer_id, late.billing_period) == (late_id, customer, period)
    assert (late.amount, late.invoice_id, late.revision, late.after_close) == (
        Decimal("7.125"),
        invoice_id,
        1,
        True,
    )
    # ... and shows in `invoicing status`, which exits 1 (it needs an operator)
    shown = CliRunner().invoke(app, ["status", "--json"], env=p.env)
    assert shown.exit_code == 1, shown.output
    view = json.loads(shown.stdout)
    [row] = view["late_usage"]
    assert (row["customer_id"], row["billing_period"], row["lines"]) == (customer, period, 1)
    assert Decimal(str(row["amount"])) == Decimal("7.125")
    assert any("late usage" in problem for problem in view["problems"]), view["problems"]

    dry = replay(p, period, Mode.DRY_RUN)
    [outcome] = dry.differences
    assert outcome.diff is not None and outcome.customer_id == customer
    [ref] = outcome.diff.usage_not_invoiced
    assert (ref.event_id, ref.amount, ref.late, ref.stored) == (
        late_id,
        Decimal("7.125"),
        True,
        True,
    )

    exact = EXPECTED.sums[(customer, period)] + Decimal("7.125")
    report = replay(p, period, Mode.APPLY)
    assert_one_correction(p, report, customer, period, exact)
    with p.connect() as conn:
        assert late_usage(conn) == []
    assert replay(p, period, Mode.DRY_RUN).differences == []


def test_two_replays_of_a_period_at_once_the_second_gets_lease_busy(pipeline: Pipeline) -> None:
    p = pipeline
    focus_flow(p)
    period = EXPECTED.periods[0]
    reading = threading.Event()
    go_on = threading.Event()
    results: list[ReplayReport | BaseException] = []

    def hold(stage: str, customer: str) -> None:
        if stage == "read":
            reading.set()
            assert go_on.wait(60)

    def first() -> None:
        try:
            results.append(replay(p, period, Mode.DRY_RUN, on_step=hold))
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert reading.wait(120), "the first replay never finished its re-read"
        before = table_counts(p)
        with pytest.raises(LeaseBusy) as busy:
            replay(p, period, Mode.APPLY)
        assert busy.value.holder is not None and busy.value.holder.endswith(":replay")
        result = CliRunner().invoke(
            app, ["replay", period, "--dry-run", "--no-progress"], env=p.env
        )
        assert result.exit_code == 4, result.output
        assert table_counts(p) == before
    finally:
        go_on.set()
        thread.join(120)
    [first_report] = results
    assert isinstance(first_report, ReplayReport)
    assert first_report.differences == [] and first_report.status == "completed"
    # Once the first is done, the period is free again.
    assert replay(p, period, Mode.DRY_RUN).differences == []


def run_replay_cli(
    p: Pipeline, period: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``invoicing replay`` as its own process (a real crash kills only that process)."""
    return subprocess.run(
        [sys.executable, "-m", "streams.entrypoints", "replay", period, *args, "--no-progress"],
        env={**os.environ, **p.env, **env},
        cwd=p.workdir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_killed_apply_keeps_its_lease_until_the_ttl_then_resumes(pipeline: Pipeline) -> None:
    """A SIGKILLed ``replay --apply`` cannot release its lease: a second run is refused
    (exit 4) until the lease's TTL passes, then resumes the same run and ends in the
    state of a clean apply (docs/design.md "Redis leases": a lease, not a lock)."""
    p = pipeline
    lost: list[tuple[str, str, str, Decimal]] = []

    def lose_two() -> None:
        first = lose_usage_line(p)
        lost.extend([first, lose_usage_line(p, period=first[1], skip=(first[0],))])

    focus_flow(p, before_close=lose_two)
    period = lost[0][1]
    ttl = "15"  # long enough that a second process starts before it ends, on a loaded machine
    killed = run_replay_cli(
        p, period, "--apply", "--lease-ttl", ttl, INVOICING_FAULT__KILL_REPLAY_AFTER_WRITES="1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert count(p, "SELECT count(*) FROM credit_notes") == 1
    with p.connect() as conn:
        runs = conn.execute("SELECT status, attempts FROM replay_runs").fetchall()
    assert runs == [("running", 1)]

    busy = run_replay_cli(p, period, "--apply", "--lease-ttl", ttl)
    assert busy.returncode == 4, busy.stderr  # the dead holder's lease is still live
    assert count(p, "SELECT count(*) FROM credit_notes") == 1

    # The lease expires: nobody renews it. Wait on its Redis key, not on the clock.
    key = DEFAULT_KEY_PREFIX + replay_lease_name(period, p.settings)
    with contextlib.closing(bootstrap.redis_client(p.settings)) as redis_conn:
        assert redis_conn.exists(key), f"the killed run's lease {key} is not in Redis"
        wait_for(
            f"the killed run's lease {key} to expire",
            lambda: not redis_conn.exists(key),
            p,
            timeout_s=float(ttl) + 30,
        )
    resumed = run_replay_cli(p, period, "--apply", "--lease-ttl", ttl)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in " ".join(resumed.stderr.split())
    for customer, _, _, _ in lost:
        row = issued_row(p, customer, period)
        assert row[1] == 2 and row[2] == round_money(EXPECTED.sums[(customer, period)], "USD")
    assert count(p, "SELECT count(*) FROM credit_notes") == 2
    assert count(p, "SELECT count(*) FROM invoices WHERE revision = 2") == 2
    with p.connect() as conn:
        runs = conn.execute("SELECT status, attempts FROM replay_runs").fetchall()
    assert runs == [("completed", 2)]
    again = run_replay_cli(p, period, "--apply", "--lease-ttl", ttl)
    assert again.returncode == 0, again.stderr
    assert count(p, "SELECT count(*) FROM credit_notes") == 2


def test_a_crashed_apply_resumes_to_the_state_of_a_clean_apply(pipeline: Pipeline) -> None:
    p = pipeline
    lost: list[tuple[str, str, str, Decimal]] = []

    def lose_two() -> None:
        first = lose_usage_line(p)
        # The second in the same period, another customer, so one run corrects both.
        lost.extend([first, lose_usage_line(p, period=first[1], skip=(first[0],))])

    focus_flow(p, before_close=lose_two)
    period = lost[0][1]
    victims = sorted(lost)
    written: list[str] = []

    def crash(stage: str, customer: str) -> None:
        if stage == "written":
            written.append(customer)
        if stage == "taxed" and written:  # the 2nd customer's tax is committed, not its write
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        replay(p, period, Mode.APPLY, on_step=crash)
    assert written == [victims[0][0]]
    assert count(p, "SELECT count(*) FROM credit_notes") == 1
    with p.connect() as conn:
        run_id, status, attempts = conn.execute(
            "SELECT run_id, status, attempts FROM replay_runs WHERE mode = 'apply'"
        ).fetchone()  # type: ignore[misc]
    assert (status, attempts) == ("running", 1)

    resumed = replay(p, period, Mode.APPLY)
    assert resumed.resumed and resumed.run_id == run_id and resumed.status == "completed"
    assert [(o.customer_id, o.outcome, o.previous_attempt) for o in resumed.differences] == [
        (victims[0][0], "corrected", True),
        (victims[1][0], "corrected", False),
    ]
    # The end state of a clean apply: one credit note and one revision 2 per victim, exact.
    for customer, _, _, _ in victims:
        exact = EXPECTED.sums[(customer, period)]
        row = issued_row(p, customer, period)
        assert row[1] == 2 and row[2] == round_money(exact, "USD")
    assert count(p, "SELECT count(*) FROM credit_notes") == 2
    assert count(p, "SELECT count(*) FROM invoices WHERE revision = 2") == 2
    assert count(p, "SELECT count(*) FROM outbox") == INVOICES + 4
    assert count(p, "SELECT count(DISTINCT document_id) FROM outbox") == INVOICES + 4
    assert count(p, "SELECT count(*) FROM usage_lines") == EXPECTED.rows
    with p.connect() as conn:
        numbers = conn.execute(
            "SELECT credit_note_number FROM credit_notes ORDER BY credit_note_number"
        ).fetchall()
        runs = conn.execute("SELECT status, attempts FROM replay_runs").fetchall()
    assert [n[0] for n in numbers] == [f"CN-{period}-000001", f"CN-{period}-000002"]  # gapless
    assert runs == [("completed", 2)]
    # Tax was recorded at most once per new revision, never refused as a conflict.
    for customer, _, _, _ in victims:
        key = f"{invoice_id_for(customer, period, 2)}:r2"
        records = p.tax.admin.requests(key_prefix=key)
        assert sum(1 for r in records if r.commit and r.outcome == "ok") <= 1
        assert all(r.status < 400 for r in records)

    wait_emails_settled(p)
    assert sum(emails_by(p, "X-Credit-Note-Id").values()) == 2
    assert set(emails_by(p, "X-Credit-Note-Id").values()) == {1}
    rev2 = [m for m in list_messages(p.maildir) if m["X-Invoice-Revision"] == "2"]
    assert sorted(m["X-Invoice-Id"] for m in rev2) == sorted(
        invoice_id_for(c, period, 2) for c, _, _, _ in victims
    )
    before = table_counts(p)
    assert replay(p, period, Mode.APPLY).differences == []
    assert table_counts(p) == before


def test_a_released_hold_is_invoiced_by_the_worker_once_and_the_replay_leaves_it(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    period = "2024-09"
    victim = min(  # a customer whose invoice is emailed (a zero total is not)
        c for (c, q), exact in EXPECTED.sums.items() if q == period and round_money(exact, "USD")
    )
    run_import_focus(SAMPLE, p.settings, progress=False)
    poison = json.dumps(
        {
            "schema_version": 1,
            "customer_id": victim,
            "billing_period": period,
            "amount": 12.5,  # a float: refused, dead-lettered, the customer held
            "currency": "USD",
            "event_time": "2024-09-03T00:00:00Z",
        }
    ).encode()
    headers: ProduceHeaders = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"poison-1"),
        ("ce_source", b"/tests"),
        ("ce_type", b"usage.recorded"),
        ("ce_time", b"2024-09-03T00:00:00Z"),
        ("ce_subject", victim.encode()),
        ("content-type", b"application/json"),
    ]
    producer = bootstrap.producer(p.settings)
    producer.produce(p.topic, key=victim.encode(), value=poison, headers=headers)
    assert producer.flush(10) == 0
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    for q in EXPECTED.periods:
        run_close_period(q, p.settings, progress=False)

    def settled() -> bool:
        with p.connect() as conn:
            held = count(p, "SELECT count(*) FROM period_closes WHERE outcome = 'held'")
            return progress_counts(conn, EXPECTED) == (INVOICES - 1, INVOICES - 1) and held == 1

    wait_for("72 invoices and one hold", settled, p)

    held = replay(p, period, Mode.DRY_RUN)
    assert held.differences == []
    assert [(o.customer_id, o.reason.split(":")[0]) for o in held.skipped] == [(victim, "held")]
    assert [(r.customer_id, r.at.partition) for r in held.invalid] == [
        (victim, held.invalid[0].at.partition)
    ]

    # Released through the runbook (`invoicing holds release`): the hold is marked released and the
    # close marker re-sent, and the invoicing worker invoices revision 1 from it. A replay run in
    # between does not write that revision itself: it would race the worker under the same tax
    # idempotency key (docs/decisions/0092-replay-and-released-holds.md); it reports the customer
    # pending instead.
    from streams.apps.ops.holds import list_holds, release_hold

    with p.connect("operator") as conn:
        [hold] = [h for h in list_holds(conn) if h.customer_id == victim]
    with p.connect("admin") as conn:
        released = release_hold(
            conn, producer, p.topic, hold.hold_id, released_by="tests", note="float refused"
        )
    assert released == [period]
    new_id = invoice_id_for(victim, period, 1)

    def invoiced() -> bool:
        return count(p, "SELECT count(*) FROM invoices WHERE invoice_id = %s", new_id) == 1

    wait_for("the victim's revision 1 from the re-sent close marker", invoiced, p)
    row = issued_row(p, victim, period)
    exact = EXPECTED.sums[(victim, period)]
    assert row[:2] == (new_id, 1) and row[2] == round_money(exact, "USD") and row[6] is None
    with p.connect() as conn:
        outbox_id = conn.execute(
            "SELECT id::text FROM outbox WHERE document_id = %s", (new_id,)
        ).fetchone()
    assert outbox_id == (deterministic_id("outbox", "invoice.issued", new_id),)
    wait_emails_settled(p)
    assert emails_by(p, "X-Invoice-Id")[new_id] == 1

    # The replay finds the worker's invoice right and changes nothing.
    after = table_counts(p)
    assert replay(p, period, Mode.DRY_RUN).differences == []
    assert replay(p, period, Mode.APPLY).differences == []
    assert table_counts(p) == after
