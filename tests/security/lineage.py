"""Records as the edge produces them for key ``key_id`` (with the header
``invoicing_key_id``), for the lineage tests of finding 1."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from streams.apps.ingest.edge import Valid, validate
from streams.core.billing.rows import Record
from streams.core.domain.codec import KEY_ID_HEADER


def metered_event(event_id: str, customer: str = "acme") -> Any:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": "security/test",
        "type": "usage.metered",
        "data": {
            "customer_id": customer,
            "metric": "api_calls",
            "event_time": "2024-09-03T10:00:00Z",
            "values": {"calls": "3"},
        },
    }


def edge_record(event: Any, key_id: str, offset: int, topic: str = "t.sec.events") -> Record:
    """``event`` validated by the edge, with the key header its server adds, as consumed."""
    valid = validate(0, event, received_at=datetime.now(UTC))
    assert isinstance(valid, Valid), valid
    record = valid.record
    headers = [(name, bytes(value)) for name, value in record.headers]
    headers.append((KEY_ID_HEADER, key_id.encode()))
    return Record(topic, 0, offset, record.key, record.value, headers)
