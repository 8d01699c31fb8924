"""The bound on a customer's stored subscription events (docs/usage-api.md, "Memory
bounds"): the retention keeps one event before the oldest period the view still answers
and every later one, and the plan of every day from that period on is unchanged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.apps.usage_view import state
from streams.core.domain.events import SubscriptionChanged, SubscriptionEnded, SubscriptionStarted
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating.segments import day_plans

START = datetime(2023, 1, 1, tzinfo=UTC)


def stored(event: SubscriptionStarted | SubscriptionChanged | SubscriptionEnded) -> dict[str, Any]:
    """The event as the view stores it in the customer's value (``state.apply``)."""
    return {"type": event.event_type, "data": event.model_dump(mode="json")}


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Up to 25 subscription events over 2023-2025, some at the same instant (midnights
    and repeated instants are where the timeline's ties and day rule bite)."""
    instants = draw(
        st.lists(
            st.one_of(
                st.integers(0, 3 * 365).map(lambda d: START + timedelta(days=d)),
                st.integers(0, 3 * 365 * 24).map(lambda h: START + timedelta(hours=h)),
            ),
            min_size=1,
            max_size=25,
        )
    )
    events: list[dict[str, Any]] = []
    for at in instants:
        at = draw(st.sampled_from([at, instants[0]]))  # repeat an instant now and then
        kind = draw(st.sampled_from(["started", "changed", "ended"]))
        plan = draw(st.sampled_from(["starter", "growth"]))
        version = draw(st.integers(1, 3))
        if kind == "ended":
            events.append(stored(SubscriptionEnded(customer_id="c", effective_at=at)))
        elif kind == "started":
            events.append(
                stored(
                    SubscriptionStarted(
                        customer_id="c", effective_at=at, plan_code=plan, plan_version=version
                    )
                )
            )
        else:
            events.append(
                stored(
                    SubscriptionChanged(
                        customer_id="c", effective_at=at, plan_code=plan, plan_version=version
                    )
                )
            )
    return events


def plans(history: list[dict[str, Any]], period: BillingPeriod) -> dict[Any, Any]:
    return day_plans(period, state.subscription_events({"subscriptions": history}))


@settings(max_examples=200, deadline=None)
@given(history=histories(), months_back=st.integers(0, 30), now_day=st.integers(0, 3 * 365))
def test_compaction_keeps_the_plan_of_every_day_from_the_horizon_on(
    history: list[dict[str, Any]], months_back: int, now_day: int
) -> None:
    now = START + timedelta(days=now_day, hours=7)
    horizon = state.subscription_horizon(now, timedelta(days=30 * months_back))
    compacted = state.compact_subscriptions(history, horizon)
    if compacted is None:  # nothing to drop: at most one event at or before the horizon
        before = [
            item
            for item in history
            if datetime.fromisoformat(item["data"]["effective_at"].replace("Z", "+00:00"))
            <= horizon
        ]
        assert len(before) <= 1
        return
    assert len(compacted) < len(history)
    period = BillingPeriod.parse(f"{horizon.year:04d}-{horizon.month:02d}")
    for _ in range(40):  # every period from the horizon's to well past the last event
        assert plans(compacted, period) == plans(history, period), period
        period = period.next()


def test_the_horizon_is_the_start_of_the_oldest_period_kept() -> None:
    now = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
    assert state.subscription_horizon(now, timedelta(days=400)) == datetime(
        2025, 10, 1, tzinfo=UTC
    )  # 2026-12-04 - 400 days = 2025-10-30: the period 2025-10 ends after it, and is kept
    period = BillingPeriod.parse("2025-10")
    assert not state.expired(
        {"period": "2025-10", "closed": None},
        now=now,
        retain_closed=timedelta(days=35),
        retain_open=timedelta(days=400),
    )
    assert state.expired(
        {"period": "2025-09", "closed": None},
        now=now,
        retain_closed=timedelta(days=35),
        retain_open=timedelta(days=400),
    )
    assert period.start == state.subscription_horizon(now, timedelta(days=400))


def test_a_long_history_keeps_one_event_before_the_horizon() -> None:
    history = [
        stored(
            SubscriptionChanged(
                customer_id="c",
                effective_at=START + timedelta(days=30 * n),
                plan_code="growth",
                plan_version=1 + n % 3,
            )
        )
        for n in range(36)  # a change a month for three years
    ]
    horizon = datetime(2025, 6, 1, tzinfo=UTC)
    compacted = state.compact_subscriptions(history, horizon)
    assert compacted is not None
    after = [i for i in history if i["data"]["effective_at"] > "2025-06-01T00:00:00Z"]
    assert compacted[1:] == after and len(compacted) == len(after) + 1
    assert state.compact_subscriptions(compacted, horizon) is None  # stable
