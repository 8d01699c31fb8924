"""close_requests: one row per (customer, billing period) that close-period asked to close.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Written by ``invoicing close-period`` (streams/apps/importers/close_period.py) in the
same transaction as its lease fence check (``lease_fences``, docs/design.md "Redis leases"),
before the ``billing_period.closed`` marker is produced: the row says which
lease holder (fencing number) requested the close and when, and a rerun finds
the row and reports the customer as already requested (the marker it resends
has the same deterministic event id, so the workers deduplicate it).
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

PERIOD_CHECK = "~ '^[0-9]{4}-(0[1-9]|1[0-2])$'"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE TABLE close_requests (
        customer_id         text NOT NULL,
        billing_period      text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        event_id            text NOT NULL UNIQUE,
        lease_fencing_token bigint NOT NULL,
        requested_at        timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (customer_id, billing_period)
    );
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
