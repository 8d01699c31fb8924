"""invoice_holds: one hold per (dead-lettered record, customer), not per record.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-15

A dead-lettered record is attributed to every customer it could belong to (its UTF-8 key, its
``ce_subject`` header, the ``customer_id`` of its JSON value): when they differ, each of them is
held (docs/decisions/0007-holds-instead-of-partial-invoices.md). The unique key that makes writing a
hold idempotent on redelivery therefore becomes (source record, customer) instead of the source
record alone, which let only the first customer's hold in.

Writers use ``ON CONFLICT (source_topic, source_partition, source_offset,
customer_id) DO NOTHING`` (:func:`streams.core.billing.store.holds.record_hold`).
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    ALTER TABLE invoice_holds
        DROP CONSTRAINT invoice_holds_source_topic_source_partition_source_offset_key;
    ALTER TABLE invoice_holds
        ADD CONSTRAINT invoice_holds_source_customer_key
        UNIQUE (source_topic, source_partition, source_offset, customer_id);
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
