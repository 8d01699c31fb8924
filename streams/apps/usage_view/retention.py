"""The usage view's retention (docs/usage-api.md "Memory bounds"): the timer's run that
drops the periods past retention on the owned partitions, their usage days and event
ids, and the subscription events no kept period can see. Moved out of
:mod:`streams.apps.usage_view.app`, which runs it every ``view.cleanup_interval_s``."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import faust

from streams.apps.usage_view import metrics, state
from streams.apps.usage_view.batch import put_key
from streams.apps.usage_view.event_index import EventIndex, parse_chunk_key

if TYPE_CHECKING:
    from streams.apps.usage_view.app import ViewConfig

log = logging.getLogger("streams.apps.usage_view.app")

__all__ = ["expire"]


def expire(
    app: faust.App,
    config: ViewConfig,
    customers: Any,
    periods: Any,
    event_ids: Any,
    usage_days: Any = None,
    index: EventIndex | None = None,
) -> dict[str, int]:
    """Drop the periods past retention on the partitions this instance owns, their
    event ids, and the period from the customer's list; each deletion is a
    tombstone on the changelog partition the key lives in (the partition of the
    records that wrote it), so a restarted owner does not restore it.

    Runs outside stream iteration (a timer), so it names the partition itself, for the
    changelog (``Table.send_changelog``) and for the local store (:func:`streams.apps.usage_view.batch.on_partition`:
    the RocksDB store refuses a write outside any event, which crashed the instance at
    its first retention before), instead of relying on the current event's.

    Then each owned customer's subscription events that no kept period can see are
    dropped (:func:`streams.apps.usage_view.state.compact_subscriptions`, from
    :func:`~streams.apps.usage_view.state.subscription_horizon`): one event before the
    oldest kept period and the events after it stay.

    Returns:
        ``{"periods": n, "event_ids": m, "subscription_events": k}`` dropped.
    """
    now = datetime.now(UTC)
    owned = {
        tp.partition for tp in app.assignor.assigned_actives() if tp.topic == config.source_topic
    }
    gone: dict[bytes, tuple[int, str, str]] = {}
    gone_days: list[tuple[bytes, int]] = []
    for key, value in list(periods.items()):
        if value is None or int(value.get("partition", -1)) not in owned:
            continue
        if state.expired(
            value, now=now, retain_closed=config.retain_closed, retain_open=config.retain_open
        ):
            customer_id, period = state.split_period_key(key.decode())
            gone[key] = (int(value["partition"]), customer_id, period)
            gone_days.extend(
                (f"{key.decode()}|{day}".encode(), int(value["partition"]))
                for day in value.get("usage_days", [])
            )
    dropped_ids = 0
    if gone:
        periods_gone = {(customer_id, period) for _, customer_id, period in gone.values()}
        partition_periods = {(partition, period) for partition, _, period in gone.values()}
        by_customer: dict[str, set[str]] = {}
        for key, (partition, customer_id, period) in gone.items():
            _delete(periods, key, partition)
            by_customer.setdefault(customer_id, set()).add(period)
        if usage_days is not None:
            for day_key, partition in gone_days:
                _delete(usage_days, day_key, partition)
        # An id's value holds its period and partition, not its customer: an id is
        # dropped when a dropped period shares both (a customer of the same partition
        # whose same period is still open keeps ids it may see again, a bound, not a leak:
        # its own period drops them later).
        open_on_partition = {
            (int(v["partition"]), str(v["period"]))
            for k, v in periods.items()
            if v is not None and k not in gone
        }
        for key, value in list(event_ids.items()):
            if value is None:
                continue
            chunk = parse_chunk_key(key)
            if chunk is not None:  # a batch's chunk of ids (event_index.py)
                where = (chunk[0], str(chunk[1]))
                ids = list(value)
            else:  # one id's key, written before chunks
                _, id_period, id_partition, _ = state.parse_seen(value)
                where = (id_partition, str(id_period))
                ids = [key.decode()]
            if where[0] in owned and where in partition_periods and where not in open_on_partition:
                _delete(event_ids, key, where[0])
                if index is not None:
                    index.drop(where[0], ids)
                dropped_ids += len(ids)
        for customer_id, _dropped in by_customer.items():
            customer = customers.get(customer_id.encode())
            if customer is None:
                continue
            kept = [p for p in customer["periods"] if (customer_id, p) not in periods_gone]
            put_key(
                customers,
                customer_id.encode(),
                {**customer, "periods": kept},
                int(customer["partition"]),
            )
        metrics.VIEW_EXPIRED.labels("periods").inc(len(gone))
        metrics.VIEW_EXPIRED.labels("event_ids").inc(dropped_ids)
        log.info(
            "usage view retention: dropped %d period(s), %d event id(s)", len(gone), dropped_ids
        )
    dropped_subscriptions = 0
    horizon = state.subscription_horizon(now, config.retain_open)
    for key, customer in list(customers.items()):
        if customer is None or int(customer.get("partition", -1)) not in owned:
            continue
        history = customer.get("subscriptions") or []
        compacted = state.compact_subscriptions(history, horizon)
        if compacted is not None:
            dropped_subscriptions += len(history) - len(compacted)
            put_key(
                customers, key, {**customer, "subscriptions": compacted}, int(customer["partition"])
            )
    if dropped_subscriptions:
        metrics.VIEW_EXPIRED.labels("subscription_events").inc(dropped_subscriptions)
        log.info(
            "usage view retention: dropped %d subscription event(s) before %s",
            dropped_subscriptions,
            horizon.date().isoformat(),
        )
    tables = {"customers": customers, "periods": periods, "event_ids": event_ids}
    if usage_days is not None:
        tables["usage_days"] = usage_days
    for name, tbl in tables.items():
        metrics.VIEW_KEYS.labels(name).set(sum(1 for _ in tbl))
    return {
        "periods": len(gone),
        "event_ids": dropped_ids,
        "subscription_events": dropped_subscriptions,
    }


def _delete(table: Any, key: bytes, partition: int) -> None:
    table.send_changelog(partition, key, None, value_serializer="raw")
    with contextlib.suppress(KeyError):
        del table.data[key]
