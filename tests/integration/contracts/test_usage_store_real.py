"""The contract of the usage store (tests/contracts/usage_store.py) on PostgreSQL
(``streams.core.billing.store.usage``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from streams.core.billing import store
from tests.contracts.stores import PERIOD, StoreHarness, unique
from tests.contracts.usage_store import UsageStoreContract, hot_row


class TestPostgresUsageStore(UsageStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness


def test_the_direct_and_the_staged_way_store_the_same_columns(
    store_harness: StoreHarness,
) -> None:
    """``insert_usage_rows`` writes a batch with no stored id by one ``COPY`` straight
    into ``usage_lines``, else through ``usage_staging``: the stored columns are the same
    either way (the same text through the same column types)."""
    customer, topic = unique("c"), unique("t")
    amounts = ["0.000000123456789", "-1.50", "12345678901234567.8", "7"]
    direct = [
        hot_row(customer, unique("e"), a, i, topic, quantity="2.50") for i, a in enumerate(amounts)
    ]
    staged = [row._replace(event_id=unique("e")) for row in direct]
    with store_harness.tx() as conn:
        assert store.usage.insert_usage_rows(conn, direct) == []
        assert store.usage.insert_usage_rows(conn, staged, direct=False) == []
    columns = (
        "customer_id, billing_period, amount::text, currency, quantity::text, unit, "
        "consumed_quantity, consumed_unit, sku_id, description, region_id, charge_category, "
        "provider, event_time, payload_sha256, source_topic, source_partition, source_offset, "
        "key_id"
    )
    with store_harness.tx() as conn:
        got = {
            row[0]: row[1:]
            for row in conn.execute(
                f"SELECT event_id, {columns} FROM usage_lines WHERE event_id = ANY(%s)",
                ([r.event_id for r in direct + staged],),
            )
        }
    assert len(got) == 8
    assert [got[r.event_id] for r in direct] == [got[r.event_id] for r in staged]
    assert got[direct[0].event_id][0] == customer and got[direct[0].event_id][1] == PERIOD
