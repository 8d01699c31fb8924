"""customers.event_time: a customer row is replaced only by a newer ``customer.upserted``.

Revision ID: 0016
Revises: 0015
Create Date: 2027-04-01

The row used to be replaced by any record read at a higher offset, so a late resend of an
old upsert (past the edge's idempotency window) restored the old name or email. The event's
own time (its envelope's CloudEvents ``time``) now orders the upserts, and a resend of the
stored event id changes nothing (streams/core/billing/store/usage.py ``upsert_customer``).
Rows stored before this migration have no known time: ``-infinity``, older than any event
that carries one (the first upsert after the migration replaces them).
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    ALTER TABLE customers
        ADD COLUMN event_time timestamptz NOT NULL DEFAULT '-infinity';
    COMMENT ON COLUMN customers.event_time IS
        'CloudEvents time of the customer.upserted stored here; -infinity: unknown';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
