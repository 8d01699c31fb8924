"""The lifecycle demo (``invoicing demo --scenario lifecycle``) end to end on the real
stack, in a sandbox: two invoices issued and emailed, a partial credit note on one and a
void of the other, each emailed exactly once; the demo's own checks pass, and this test
checks the rows and the Maildir again on its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams import bootstrap
from streams.core.domain.events import invoice_id_for
from streams.devtools.demo.lifecycle import PERIOD, run_lifecycle_demo
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.support.pipeline import Pipeline, isolated_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def test_the_lifecycle_demo_credits_in_part_voids_and_emails_each_once(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    report = run_lifecycle_demo(
        p.settings,
        clients=bootstrap.lifecycle_demo_clients(),
        timeout_s=180,
        env=p.env,
        maildir=p.maildir,
        stack_up=False,
    )
    assert report.ok, (report.problems, p.worker_logs()[-4000:])
    assert [(what, status, emails) for what, _, status, emails in report.documents] == [
        ("invoice (then credited in part)", "issued", 1),
        ("partial credit note", "issued", 1),
        ("invoice (then voided)", "voided", 1),
        ("void notice", "sent", 1),
    ]
    credited = invoice_id_for(f"life-{report.run}-credit", PERIOD, 1)
    voided = invoice_id_for(f"life-{report.run}-void", PERIOD, 1)
    with p.connect() as conn:
        rows = dict(
            conn.execute(
                "SELECT invoice_id::text, status FROM invoices WHERE invoice_id = ANY(%s)",
                ([credited, voided],),
            ).fetchall()
        )
        notes = conn.execute(
            "SELECT kind, count(*) FROM credit_notes WHERE invoice_id = %s GROUP BY kind",
            (credited,),
        ).fetchall()
    assert rows == {credited: "issued", voided: "voided"}
    assert notes == [("partial", 1)]
    messages = list_messages(p.maildir)
    assert sum(m["X-Invoice-Id"] in (credited, voided) for m in messages) == 2
    assert sum(m["X-Credited-Invoice-Id"] == credited for m in messages) == 1
    assert sum(m["X-Voided-Invoice-Id"] == voided for m in messages) == 1
