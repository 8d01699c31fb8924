"""Finding 1, the trace (docs/security.md "API keys"): the key that sent an event was not
recorded. Now the edge's record header ``invoicing_key_id`` reaches the invoicing worker's
batch, on the fast path (``usage.recorded``) and the reference decoder's
(``usage.metered``), as the rows' ``key_id`` (stored by migration 0017:
``tests/security/db/test_key_lineage.py``).

Before the fix the rows had no ``key_id``.
"""

from __future__ import annotations

from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.kafka import InMemoryKafka
from streams.adapters.memory.stores import MEMORY
from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.invoicing.decoding import decode_run, key_id_of
from streams.apps.invoicing.worker import InvoicingWorker
from streams.core.billing import fencing
from streams.core.billing.rows import Record
from streams.core.domain.codec import KEY_ID_HEADER
from streams.settings import Settings
from tests.security.edge import usage_event
from tests.security.lineage import edge_record, metered_event


def test_the_key_id_of_the_header_reaches_the_usage_and_metered_rows(settings: Settings) -> None:
    worker = InvoicingWorker(
        settings,
        pool=InMemoryDatabase(),
        stores=MEMORY,
        tax=InMemoryTaxService(),
        consumer=InMemoryKafka().consumer(settings.worker.invoicing_group),
        producer=None,  # type: ignore[arg-type]  # no dead letter here
    )
    msgs = [
        edge_record(usage_event("l-1"), "k1a2b3c4", 0),
        edge_record(metered_event("l-2"), "k1a2b3c4", 1),
    ]
    token = fencing.FencingToken("g", "t.sec.events", 0, 1, "m")
    batch = worker._add_run(decode_run(0, token, msgs), {})
    assert batch is not None
    assert [(r.event_id, r.key_id) for r in batch.usage] == [("l-1", "k1a2b3c4")]
    assert [(r.event_id, r.key_id) for r in batch.metered] == [("l-2", "k1a2b3c4")]


def test_a_record_without_or_with_a_bad_header_has_no_key_id() -> None:
    def record(headers: list[tuple[str, bytes]]) -> Record:
        return Record("t", 0, 0, b"acme", b"{}", headers)

    assert key_id_of(record([])) is None
    assert key_id_of(record([(KEY_ID_HEADER, b"\xff")])) is None
    assert key_id_of(record([(KEY_ID_HEADER, b"x" * 65)])) is None
    assert key_id_of(record([(KEY_ID_HEADER, b"abc")])) == "abc"
