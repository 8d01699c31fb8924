"""The metered-usage and subscription contracts (streams/core/domain/events.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]
from pydantic import ValidationError as ModelError

from streams.core.domain.codec import decode, encode
from streams.core.domain.events import (
    EVENT_TYPES,
    Envelope,
    EventData,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    event_models,
)
from streams.topics import ACCOUNT_EVENTS

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
TOPIC = "billing.account-events.v1"
#: The models the registry says the account-events topic carries.
TOPIC_MODELS = event_models(ACCOUNT_EVENTS.event_types)
WHEN = datetime(2024, 9, 30, 23, 59, 59, 999000, tzinfo=UTC)
CUSTOMER = "acme-42"


def metered(**changes: Any) -> UsageMetered:
    fields: dict[str, Any] = {
        "customer_id": CUSTOMER,
        "metric": "storage_gb",
        "event_time": WHEN,
        "properties": {"region": "eu-west-1", "user_id": "u-17"},
        "values": {"gb": "12.50"},
    }
    return UsageMetered(**(fields | changes))


def samples() -> list[EventData]:
    return [
        metered(),
        SubscriptionStarted(
            customer_id=CUSTOMER, plan_code="growth", plan_version=2, effective_at=WHEN
        ),
        SubscriptionChanged(
            customer_id=CUSTOMER, plan_code="scale", plan_version=1, effective_at=WHEN
        ),
        SubscriptionEnded(customer_id=CUSTOMER, effective_at=WHEN, reason="churned"),
    ]


def validator(event_type: str) -> Draft202012Validator:
    path = SCHEMAS / TOPIC / f"{event_type}.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_the_new_types_are_account_events_with_past_tense_names() -> None:
    for model in (UsageMetered, SubscriptionStarted, SubscriptionChanged, SubscriptionEnded):
        assert EVENT_TYPES[model.event_type] is model
        assert model in TOPIC_MODELS
        assert model.event_type.split(".")[-1].endswith("ed")
        assert model.model_config.get("frozen") is True
        assert model.model_config.get("extra") == "forbid"
        assert "schema_version" in model.model_fields


@pytest.mark.parametrize("event", samples(), ids=lambda event: event.event_type)
def test_an_encoded_event_validates_and_round_trips_keyed_by_customer(event: EventData) -> None:
    record = encode(Envelope.wrap(event, id="e-1", source="urn:test", time=WHEN))
    assert record.key == CUSTOMER.encode()
    validator(event.event_type).validate(json.loads(record.value))
    envelope = decode(record.key, record.value, record.headers, allowed=TOPIC_MODELS)
    assert envelope.data == event


def test_a_decimal_value_has_one_canonical_wire_form() -> None:
    """ "10", "10.0" and "1E+1" are one value: one payload, so a resend is a
    duplicate, never a conflict; and never a JSON number."""
    forms = [metered(values={"gb": text}) for text in ("10", "10.0", "10.000", "1E+1")]
    wires = {event.model_dump_json() for event in forms}
    assert len(wires) == 1
    assert json.loads(wires.pop())["values"] == {"gb": "10"}
    assert metered(values={"gb": "-0.0"}).values == {"gb": Decimal(0)}
    assert metered(values={"gb": "0.00120"}).model_dump(mode="json")["values"] == {"gb": "0.0012"}


def test_text_properties_stay_exact_strings() -> None:
    """Text is compared as written: "007" and "7" are two seats."""
    assert metered(properties={"seat": "007"}).properties == {"seat": "007"}
    assert metered(properties={"seat": "007"}) != metered(properties={"seat": "7"})


@pytest.mark.parametrize(
    "bad",
    [
        {"values": {"gb": 12.5}},  # a float
        {"values": {"gb": "twelve"}},
        {"values": {"gb": "NaN"}},
        {"values": {"gb": "1E+999999"}},  # would expand to a million digits
        {"values": {"gb": "1" * 49}},
        {"properties": {"region": 7}},  # text must be text
        {"properties": {"region": "x" * 257}},
        {"properties": {f"p{i}": "v" for i in range(33)}},
        {"properties": {"bad name": "v"}},
        {"properties": {"gb": "12"}, "values": {"gb": "12"}},  # one name, two maps
        {"metric": "api calls"},
        {"event_time": datetime(2024, 9, 1)},  # naive
        {"discount": "1"},  # extra field
    ],
)
def test_the_model_refuses(bad: dict[str, Any]) -> None:
    with pytest.raises(ModelError):
        metered(**bad)


def test_the_schema_refuses_what_the_model_refuses_on_the_wire() -> None:
    value = json.loads(metered().model_dump_json())
    check = validator("usage.metered")
    check.validate(value)
    for bad in (
        value | {"values": {"gb": 12.5}},
        value | {"values": {"gb": "1e3"}},
        value | {"properties": {"region": 7}},
        value | {"properties": {"bad name": "x"}},
        value | {"properties": {f"p{i}": "v" for i in range(33)}},
        value | {"discount": "1"},
        {k: v for k, v in value.items() if k != "metric"},
    ):
        with pytest.raises(ValidationError):
            check.validate(bad)


def test_times_are_normalised_to_utc() -> None:
    paris = timezone(timedelta(hours=2))
    event = SubscriptionStarted(
        customer_id=CUSTOMER,
        plan_code="growth",
        plan_version=1,
        effective_at=datetime(2024, 9, 1, 2, 0, tzinfo=paris),
    )
    assert event.effective_at == datetime(2024, 9, 1, 0, 0, tzinfo=UTC)
    assert event.effective_at.tzinfo == UTC
    with pytest.raises(ModelError):
        SubscriptionStarted(
            customer_id=CUSTOMER, plan_code="growth", plan_version=0, effective_at=WHEN
        )
