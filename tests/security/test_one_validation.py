"""Finding 2, two validations that disagree (docs/security.md "One validation"): the edge's
one-pass batch path (``validate_batch_fast``) accepted an ``id`` with a NUL or a bidi
control, or a 600-character ``source``, which the single-event path and the consumers'
``Envelope`` refuse; such a record reached the topic, was dead-lettered there, and held the
customer's invoice. The batch path's attribute constraints are now the ``Envelope``'s own.
The property: on the same event, both paths give the same verdict (and, when they accept
it, the same record).

Before the fix the examples below were accepted by the batch path alone.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streams.apps.ingest.edge import Valid, validate, validate_batch_fast

NOW = datetime(2024, 9, 30, 12, tzinfo=UTC)

#: Characters the attribute rules are about: controls (C0, C1), bidi controls, and ordinary
#: text around them.
_DANGER = st.sampled_from(
    ["\x00", "\x07", "\t", "\n", "\x1b", "\x7f", "\x85", "\u202a", "\u202e", "\u2066", "\u2069"]
)
_TEXT = st.lists(st.one_of(_DANGER, st.characters(codec="utf-8")), max_size=12).map("".join)
_LONG = st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "\u202e"]), st.integers(0, 1100))
ATTRIBUTE = st.one_of(_TEXT, _LONG, st.just(""), st.just("ok-1"))


def event(event_id: str, source: str, subject: str | None = "acme") -> dict[str, Any]:
    item: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": "usage.recorded",
        "data": {
            "customer_id": "acme",
            "billing_period": "2024-09",
            "amount": "1.25",
            "currency": "USD",
            "event_time": "2024-09-03T10:00:00Z",
        },
    }
    if subject is not None:
        item["subject"] = subject
    return item


def verdicts(item: dict[str, Any]) -> tuple[Valid | None, Valid | None]:
    """(the single-event path's record or None, the batch path's record or None)."""
    single = validate(0, json.loads(json.dumps(item)), received_at=NOW)
    fast = validate_batch_fast(json.dumps([item]).encode(), received_at=NOW)
    return (single if isinstance(single, Valid) else None, fast[0] if fast else None)


@pytest.mark.parametrize(
    ("event_id", "source"),
    [
        ("a\x00b", "crm"),
        ("a\u202eb", "crm"),
        ("a\u2066b", "crm"),
        ("a\x1bb", "crm"),
        ("ok", "s" * 600),
        ("ok", "crm\x00"),
        ("ok", "\u202ecrm"),
        ("i" * 257, "crm"),
    ],
)
def test_the_batch_path_refuses_what_the_envelope_refuses(event_id: str, source: str) -> None:
    single, fast = verdicts(event(event_id, source))
    assert single is None
    assert fast is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_id=ATTRIBUTE, source=ATTRIBUTE, subject=st.one_of(st.none(), ATTRIBUTE))
@example(event_id="a\x00b", source="crm", subject=None)
@example(event_id="ok", source="s" * 600, subject=None)
@example(event_id="ok", source="s" * 512, subject="acme")
def test_both_paths_give_the_same_verdict(event_id: str, source: str, subject: str | None) -> None:
    single, fast = verdicts(event(event_id, source, subject))
    assert (single is None) == (fast is None), (single, fast)
    if single is not None and fast is not None:
        assert single.record == fast.record and single.claim == fast.claim
