"""Rating end to end on the real stack: metered events to an emailed invoice, shadow
re-rating, a replay apply after a plan change, and the published price book.

Each test runs in its own sandbox (database, topics, groups, connector, SMTP sink,
tax service) with worker processes: ``invoicing plans publish`` (CLI) →
PostgreSQL + ``billing.price-book.v1``; account events (``customer.upserted``,
``subscription.*``, ``usage.metered``, ``usage.recorded``) → invoicing workers →
invoices + outbox → Debezium → ``billing.invoices.v1`` → email sender → SMTP sink.
The figures are worked by hand in :mod:`tests.support.rating`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streams.apps.replay import CandidateBook, Mode
from streams.bootstrap import replay_period, run_close_period
from streams.core.domain.codec import decode
from streams.core.domain.events import (
    BillableMetricPublished,
    EventData,
    InvoiceIssued,
    PlanVersionPublished,
    UsageRecorded,
    invoice_id_for,
)
from streams.core.domain.rating import load_price_book
from streams.devtools.stack.maildir import list_messages
from streams.entrypoints.app import app
from streams.settings import Settings
from streams.topics import PRICE_BOOK
from tests.support import rating as scenario
from tests.support.kafka import drain, headers_of
from tests.support.pipeline import Pipeline, isolated_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PERIOD = scenario.PERIOD
METERED = "acme-metered"
FOCUS = "focus-account"


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def cli(p: Pipeline, *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=p.env)


def count(p: Pipeline, sql: str, *params: Any) -> int:
    with p.connect() as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def wait_for(what: str, check: Callable[[], bool], p: Pipeline, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
        assert not dead, f"workers died: {dead}\n{p.worker_logs()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{p.worker_logs()}")


def wait_emailed(p: Pipeline, documents: int) -> None:
    """``documents`` outbox documents each with a final email delivery."""
    wait_for(
        f"{documents} document(s) emailed",
        lambda: (
            count(
                p,
                "SELECT count(DISTINCT o.document_id) FROM outbox o JOIN email_deliveries d "
                "ON d.document_id = o.document_id AND d.status IN ('sent', 'skipped')",
            )
            == documents
        ),
        p,
    )


def publish(p: Pipeline, path: Path) -> Any:
    result = cli(p, "plans", "publish", str(path))
    assert result.exit_code == 0, result.output
    return result


def focus_usage() -> list[tuple[str, EventData]]:
    """A pre-priced (FOCUS-like) customer without a subscription: 3 lines, 3.005 → 3.00."""
    return [(scenario.event_id(FOCUS, "customer"), scenario.customer(FOCUS))] + [
        (
            scenario.event_id(FOCUS, str(n)),
            UsageRecorded(
                customer_id=FOCUS,
                billing_period=PERIOD,
                amount=Decimal(amount),
                currency="USD",
                description=f"Compute line {n}",
                event_time=scenario.utc(2),
            ),
        )
        for n, amount in enumerate(("1.005", "2.50", "-0.50"))
    ]


def metered_customer(changed: bool = False) -> list[tuple[str, EventData]]:
    events: list[tuple[str, EventData]] = [
        (scenario.event_id(METERED, "customer"), scenario.customer(METERED)),
        (scenario.event_id(METERED, "sub"), scenario.started(METERED)),
    ]
    events += list(scenario.metered(METERED))
    # A resend of the first storage event with the same value written differently: a
    # duplicate (canonical decimals), neither a conflict nor counted twice.
    [(gb_id, gb)] = [(e, d) for e, d in scenario.metered(METERED) if e.endswith("gb-1")]
    events.append((gb_id, gb.model_copy(update={"values": {"gb": Decimal("12.50")}})))
    return events


def issued_events(p: Pipeline, expected: int) -> dict[str, InvoiceIssued]:
    records = drain(p.settings.kafka, p.invoices_topic, expected=expected, timeout_s=90)
    found: dict[str, InvoiceIssued] = {}
    for record in records:
        envelope = decode(record.key(), record.value(), headers_of(record))
        if isinstance(envelope.data, InvoiceIssued):
            found[envelope.data.invoice_id] = envelope.data
    return found


def invoice_email(p: Pipeline, invoice_id: str) -> str:
    [message] = [m for m in list_messages(p.maildir) if m["X-Invoice-Id"] == invoice_id]
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    return str(body.get_content())


def run_to_invoices(p: Pipeline, book: Path, events: list[tuple[str, EventData]], n: int) -> None:
    publish(p, book)
    scenario.produce(p.settings, p.topic, events)
    p.workers.start("invoicing", 1)
    p.workers.start("email", 1)
    summary = run_close_period(PERIOD, p.settings, progress=False)
    assert len(summary.customers) == n, summary.customers
    wait_for(
        f"{n} invoices",
        lambda: count(p, "SELECT count(*) FROM invoices WHERE status = 'issued'") == n,
        p,
    )
    wait_emailed(p, n)


# --------------------------------------------------------------------------- tests


def test_metered_events_become_an_emailed_invoice_with_the_expected_lines(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    book = scenario.write_book(tmp_path / "book.yaml")
    run_to_invoices(p, book, metered_customer() + focus_usage(), 2)

    metered_id = invoice_id_for(METERED, PERIOD, 1)
    focus_id = invoice_id_for(FOCUS, PERIOD, 1)
    with p.connect() as conn:
        subtotal = conn.execute(
            "SELECT subtotal, line_count FROM invoices WHERE invoice_id = %s", (metered_id,)
        ).fetchone()
        stored = conn.execute("SELECT count(*) FROM metered_usage").fetchone()
    assert subtotal == (scenario.SUBTOTAL_V1, 3)
    assert stored == (352,)  # 350 calls + 2 storage events; the resend was a duplicate

    events = issued_events(p, 2)
    metered = events[metered_id]
    assert metered.subtotal == scenario.SUBTOTAL_V1
    assert metered.charges is not None and metered.rating is not None
    assert metered.rating.exact_total == scenario.EXACT_V1
    assert metered.rating.metered_events == 352
    by_code = {c.charge_code: c for c in metered.charges}
    assert (by_code["platform"].amount, by_code["platform"].plan_code) == (Decimal(30), "pro")
    api = by_code["api"]
    assert (api.metric, api.quantity, api.plan_version) == ("api_calls", Decimal(350), 1)
    assert [(t.units, t.unit_price, t.amount) for t in api.tiers] == [
        (Decimal(100), Decimal(0), Decimal(0)),
        (Decimal(250), Decimal("0.05"), Decimal("12.50")),
    ]
    storage = by_code["storage"]
    assert (storage.quantity, storage.unit_price, storage.amount) == (
        Decimal("12.5"),
        Decimal("0.25"),
        Decimal("3.125"),
    )
    # The pure pass-through customer's event has no rating fields at all (as before rating).
    focus = events[focus_id]
    assert focus.charges is None and focus.rating is None
    assert focus.subtotal == Decimal("3.00") and focus.line_count == 3
    raw = [
        json.loads(r.value() or b"null")
        for r in drain(p.settings.kafka, p.invoices_topic, expected=2, timeout_s=30)
    ]
    [focus_json] = [v for v in raw if v["invoice_id"] == focus_id]
    assert "charges" not in focus_json and "rating" not in focus_json

    text = invoice_email(p, metered_id)
    for expected in (
        "Plan pro v1 (2024-09-01..2024-09-30)",
        "30.00 USD  Platform fee",
        "12.50 USD  API calls",
        "350 calls",
        "tier 2 (above 100 up to 1,000): 250 x 0.05 = 12.50",
        "3.125 USD  Storage",
        "12.5 GB x 0.25",
        "Sum of the lines (exact): 45.625 USD",
        "Subtotal = the sum rounded once, half-even, to the minor unit: 45.62 USD",
        "Metered events rated: 352",
    ):
        assert expected in text, f"{expected!r} not in the email:\n{text}"
    focus_text = invoice_email(p, focus_id)
    assert "Lines:" in focus_text and "Charges:" not in focus_text
    assert "Compute line 1" in focus_text

    # The price book topic holds one record per entry, keyed by the entry.
    records = drain(
        p.settings.kafka,
        PRICE_BOOK.with_prefix(p.settings.kafka.topic_prefix).name,
        expected=3,
        timeout_s=30,
    )
    keys = sorted((r.key() or b"").decode() for r in records)
    assert keys == ["metric/api_calls", "metric/storage_gb", "plan/pro/1"]
    decoded = [decode(r.key(), r.value(), headers_of(r)).data for r in records]
    assert {type(d) for d in decoded} == {BillableMetricPublished, PlanVersionPublished}

    # Publishing the same book again is a no-op; v1 with another price is refused.
    again = publish(p, book)
    assert "0 new, 3 unchanged" in again.output
    changed = scenario.write_book(tmp_path / "changed.yaml", tier2="0.06")
    refused = cli(p, "plans", "publish", str(changed))
    assert refused.exit_code == 3, refused.output
    assert "plan version plan/pro/1 is already published" in refused.output
    with p.connect() as conn:
        definition = conn.execute(
            "SELECT definition FROM plan_versions WHERE plan_code = 'pro'"
        ).fetchone()
    assert definition is not None
    assert definition[0]["charges"][1]["tiers"][1]["unit_price"] == "0.05"
    listed = cli(p, "plans", "list", "--json")
    assert listed.exit_code == 0 and "plan/pro/1" in listed.output


def test_shadow_re_rating_then_a_plan_change_replayed_with_credit_note_and_revision(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    run_to_invoices(
        p, scenario.write_book(tmp_path / "book.yaml"), metered_customer() + focus_usage(), 2
    )
    before = count(p, "SELECT count(*) FROM invoices") + count(p, "SELECT count(*) FROM outbox")

    # Shadow re-rating: "what would tier 2 at 0.06 have billed in September?"
    candidate_path = scenario.write_book(tmp_path / "candidate.yaml", tier2="0.06")
    candidate = CandidateBook(
        load_price_book(candidate_path.read_text()), f"candidate {candidate_path}"
    )
    shadow = replay_period(
        PERIOD, p.settings, mode=Mode.DRY_RUN, progress=False, candidate=candidate
    )
    assert shadow.price_book.startswith(f"candidate {candidate_path}")
    [outcome] = shadow.differences
    assert (outcome.customer_id, outcome.outcome) == (METERED, "difference")
    diff = outcome.difference
    assert diff is not None
    assert diff["issued"]["subtotal"] == "45.62"
    assert diff["recomputed"]["subtotal"] == str(scenario.SUBTOTAL_TIER2_006)
    assert Decimal(diff["delta"]["subtotal"]) == Decimal("2.50")
    [line] = diff["charges_changed"]
    assert (line["description"], line["issued"], line["rebuilt"], line["delta"]) == (
        "API calls",
        "12.50",
        "15.00",
        "2.50",
    )
    assert diff["usage_not_invoiced"] == [] and diff["invoiced_not_in_usage"] == []
    assert shadow.unchanged == 1  # the pass-through customer
    # The same through the CLI; and a candidate book is refused for an apply.
    shown = cli(
        p, "replay", PERIOD, "--dry-run", "--no-progress", "--price-book", str(candidate_path),
        "--report", str(tmp_path / "shadow.json"),
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    report = json.loads((tmp_path / "shadow.json").read_text())
    assert [d["difference"]["delta"]["subtotal"] for d in report["differences"]] == ["2.50"]
    refused = cli(
        p, "replay", PERIOD, "--apply", "--no-progress", "--price-book", str(candidate_path)
    )
    assert refused.exit_code == 2, refused.output
    after = count(p, "SELECT count(*) FROM invoices") + count(p, "SELECT count(*) FROM outbox")
    assert after == before  # shadow re-rating writes no invoice, event or email

    # The plan change: version 2 published, the customer moved to it from 09-16 (late).
    publish(p, scenario.write_book(tmp_path / "v2.yaml", with_v2=True))
    scenario.produce(
        p.settings,
        p.topic,
        [(scenario.event_id(METERED, "change"), scenario.changed_to_v2(METERED))],
    )
    dry = replay_period(PERIOD, p.settings, mode=Mode.DRY_RUN, progress=False)
    [difference] = dry.differences
    assert difference.difference is not None
    assert difference.difference["recomputed"]["subtotal"] == str(scenario.SUBTOTAL_CHANGED)
    applied = replay_period(PERIOD, p.settings, mode=Mode.APPLY, progress=False)
    [corrected] = applied.differences
    assert (corrected.customer_id, corrected.outcome, corrected.revision) == (
        METERED,
        "corrected",
        2,
    )
    old_id, new_id = invoice_id_for(METERED, PERIOD, 1), invoice_id_for(METERED, PERIOD, 2)
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT invoice_id::text, status, subtotal FROM invoices WHERE customer_id = %s "
            "ORDER BY revision",
            (METERED,),
        ).fetchall()
        note = conn.execute(
            "SELECT subtotal FROM credit_notes WHERE invoice_id = %s", (old_id,)
        ).fetchone()
        segments = conn.execute(
            "SELECT plan_version, count(*), sum(amount) FROM invoice_charges "
            "WHERE invoice_id = %s GROUP BY 1 ORDER BY 1",
            (new_id,),
        ).fetchall()
    assert rows == [
        (old_id, "superseded", scenario.SUBTOTAL_V1),
        (new_id, "issued", scenario.SUBTOTAL_CHANGED),
    ]
    assert note == (scenario.SUBTOTAL_V1,)
    assert segments == [(1, 3, Decimal("23.125")), (2, 3, Decimal("27.00"))]
    wait_emailed(p, 4)  # two first invoices, the credit note, the revision
    messages = list_messages(p.maildir)
    assert Counter(str(m["X-Credited-Invoice-Id"]) for m in messages if m["X-Credit-Note-Id"]) == {
        old_id: 1
    }
    assert Counter(str(m["X-Invoice-Id"]) for m in messages if m["X-Invoice-Id"]) == {
        old_id: 1,
        new_id: 1,
        invoice_id_for(FOCUS, PERIOD, 1): 1,
    }
    text = invoice_email(p, new_id)
    assert "Plan pro v1 (2024-09-01..2024-09-15)" in text
    assert "Plan pro v2 (2024-09-16..2024-09-30)" in text
    assert "45.00 x 15/30 days" in text
    assert "Sum of the lines (exact): 50.125 USD" in text
    # Applying again changes nothing.
    again = replay_period(PERIOD, p.settings, mode=Mode.APPLY, progress=False)
    assert again.differences == [] and again.failed == []


def test_a_gap_in_the_book_holds_the_invoice_shown_by_status_until_fixed(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    publish(p, scenario.write_book(tmp_path / "book.yaml"))
    events = metered_customer()
    # The customer subscribes to version 2, which is not published yet.
    events[1] = (scenario.event_id(METERED, "sub"), scenario.started(METERED, version=2))
    scenario.produce(p.settings, p.topic, events)
    p.workers.start("invoicing", 1)
    p.workers.start("email", 1)
    run_close_period(PERIOD, p.settings, progress=False)
    wait_for(
        "the close held",
        lambda: count(p, "SELECT count(*) FROM period_closes WHERE outcome = 'held'") == 1,
        p,
    )
    assert count(p, "SELECT count(*) FROM invoices") == 0  # never billed as zero
    status = cli(p, "status", "--json")
    assert status.exit_code == 1  # an open hold needs an operator
    view = json.loads(status.output)
    [hold] = view["holds"]
    assert hold["customer_id"] == METERED and hold["reason"].startswith("rating: unknown_plan")
    assert "version 2 of plan 'pro'" in hold["reason"]
    listed = cli(p, "holds", "list")
    assert listed.exit_code == 0 and METERED in listed.output and "rating:" in listed.output

    # The fix: publish version 2, release the hold: the invoice is issued under v2.
    publish(p, scenario.write_book(tmp_path / "v2.yaml", with_v2=True))
    released = cli(p, "holds", "release", str(hold["hold"]), "--note", "v2 published")
    assert released.exit_code == 0, released.output
    wait_for(
        "the invoice",
        lambda: count(p, "SELECT count(*) FROM invoices WHERE status = 'issued'") == 1,
        p,
    )
    with p.connect() as conn:
        subtotal = conn.execute("SELECT subtotal FROM invoices").fetchone()
    # v2 all month: 45 + 12.50 (calls) + 3.125 (storage) = 60.625 → 60.62
    assert subtotal == (Decimal("60.62"),)
