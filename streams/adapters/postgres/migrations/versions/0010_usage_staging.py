"""usage_staging: where the invoicing worker COPYs a poll batch's usage before inserting it.

Revision ID: 0010
Revises: 0007
Create Date: 2027-03-01

``COPY`` has no ``ON CONFLICT``, so the worker copies a batch's usage rows here and
moves them into ``usage_lines`` with one ``DELETE … RETURNING`` feeding an
``INSERT … SELECT … ON CONFLICT (event_id) DO NOTHING`` in the same transaction
(streams/core/billing/store/usage.py ``insert_usage_rows``). Each row carries the
transaction that wrote it (``xact``, default ``pg_current_xact_id()``), so concurrent
workers share the table and each moves only its own rows; no row outlives its
transaction (a rolled-back one leaves no visible row either). ``UNLOGGED``: its rows
never need to survive a crash, so they cost no WAL. The runtime roles may not create
temporary tables, hence a table of the migrations (grants:
streams/adapters/postgres/grants.py ``usage_staging``; docs/decisions/0010-batch-first-ingest.md).

Numbers 0008, 0009 and 0011-0014 are unused: migrations are numbered in blocks, one per
line of work, and only the chain of ``down_revision`` orders them.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0010"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    CREATE UNLOGGED TABLE usage_staging (
        xact               xid8 NOT NULL DEFAULT pg_current_xact_id(),
        ordinal            integer NOT NULL,
        event_id           text NOT NULL,
        customer_id        text NOT NULL,
        billing_period     text NOT NULL,
        amount             numeric NOT NULL,
        currency           char(3) NOT NULL,
        quantity           numeric,
        unit               text,
        consumed_quantity  numeric,
        consumed_unit      text,
        sku_id             text,
        description        text,
        region_id          text,
        charge_category    text,
        provider           text,
        event_time         timestamptz NOT NULL,
        payload_sha256     text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL
    ) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
    CREATE INDEX usage_staging_xact ON usage_staging (xact);
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
