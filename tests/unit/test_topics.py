"""The topic registry (streams/topics.py) is the one place that says which event types a
topic carries; the domain's models and the registry's names agree."""

from __future__ import annotations

import pytest

from streams.core.domain.events import EVENT_TYPES, event_models
from streams.topics import (
    ACCOUNT_EVENTS,
    DEAD_LETTER_TOPICS,
    INVOICES,
    REGISTRY,
    by_name,
)


def test_every_event_type_is_carried_by_exactly_one_topic() -> None:
    carried = [name for spec in REGISTRY for name in spec.event_types]
    assert sorted(carried) == sorted(EVENT_TYPES)


def test_the_registry_names_only_known_event_types_in_contract_order() -> None:
    assert [m.event_type for m in event_models(ACCOUNT_EVENTS.event_types)] == [
        "customer.upserted",
        "usage.recorded",
        "billing_period.closed",
        "usage.metered",
        "subscription.started",
        "subscription.changed",
        "subscription.ended",
    ]
    assert [m.event_type for m in event_models(INVOICES.event_types)] == [
        "invoice.issued",
        "credit_note.issued",
        "invoice.voided",
    ]


def test_dead_letter_topics_carry_no_event_type_of_their_own() -> None:
    for name in DEAD_LETTER_TOPICS:
        assert by_name(name).event_types == ()


def test_a_prefixed_topic_carries_the_same_event_types() -> None:
    assert ACCOUNT_EVENTS.with_prefix("t1.").event_types == ACCOUNT_EVENTS.event_types


def test_an_unknown_event_type_name_is_refused() -> None:
    with pytest.raises(KeyError, match=r"usage\.recorded\.v2"):
        event_models(("usage.recorded", "usage.recorded.v2"))
