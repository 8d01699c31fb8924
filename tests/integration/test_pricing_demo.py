"""The pricing demo end to end on the real stack, in a sandbox: the generated month of
12 customers (every profile) published, produced, invoiced, emailed, and every invoice
and line equal to the independent answer; running it again changes nothing.

Needs the rating wiring (``invoicing plans publish``, the worker storing
``usage.metered`` and ``subscription.*``, the invoice job calling ``rate()``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams import bootstrap
from streams.devtools.demo.pricing.generator import PROFILES, ScenarioConfig
from streams.devtools.demo.pricing.run import PricingReport, run_pricing_demo
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.support.pipeline import Pipeline, isolated_pipeline

BOOK = Path(__file__).resolve().parents[2] / "examples" / "pricing" / "price-book.yaml"
CONFIG = ScenarioConfig(customers=len(PROFILES), seed=3)


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def run(p: Pipeline, events_file: Path) -> PricingReport:
    return run_pricing_demo(
        p.settings,
        clients=bootstrap.pricing_demo_clients(),
        config=CONFIG,
        book=BOOK,
        events_file=events_file,
        workers=2,
        timeout_s=240,
        env=p.env,
        maildir=p.maildir,
        stack_up=False,
    )


def explain(report: PricingReport, p: Pipeline) -> str:
    lines = [
        f"{r.customer.profile} {r.verdict}: expected {r.expected.subtotal}, invoiced "
        f"{r.subtotal}, {r.line_differences[:5]} {r.hold_reason or ''}"
        for r in report.results
        if r.verdict != "match"
    ]
    return "\n".join([*lines, str(report.emails_not_sent), p.worker_logs()[-4000:]])


def test_the_pricing_month_is_invoiced_exactly_as_the_independent_answer(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    report = run(p, tmp_path / "events.jsonl")
    assert report.ok, explain(report, p)
    assert report.count("match") == len(PROFILES) == report.invoices
    assert {r.customer.profile for r in report.results} == set(PROFILES)
    assert report.duplicates_resent > 0
    assert report.distinct_events == report.events_in_file - report.duplicates_resent
    assert report.changes_in_period >= 5 and report.ends_in_period == 1
    assert report.emails_sent == len(PROFILES) and report.duplicate_emails == 0
    with p.connect() as conn:
        stored = conn.execute("SELECT count(*) FROM metered_usage").fetchone()
        assert stored == (report.events_by_type["usage.metered"] - report.duplicates_resent,)
        rated = conn.execute(
            "SELECT count(*) FROM invoices WHERE status = 'issued' AND rating IS NOT NULL"
        ).fetchone()
        assert rated == (len(PROFILES),)
    by_profile = {r.customer.profile: r for r in report.results}
    assert [s[:2] for s in by_profile["round-trip"].expected.segments] == [
        ("starter", 1),
        ("growth", 2),
    ]
    assert any(line.model == "minimum" for r in report.results for line in r.expected.lines)

    # Again: the same ids, the same markers; nothing new is invoiced or emailed.
    messages = len(list_messages(p.maildir))
    again = run(p, tmp_path / "events.jsonl")
    assert again.ok, explain(again, p)
    assert [r.invoice_number for r in again.results] == [r.invoice_number for r in report.results]
    assert again.revisions_above_one == 0
    assert len(list_messages(p.maildir)) == messages == len(PROFILES)
