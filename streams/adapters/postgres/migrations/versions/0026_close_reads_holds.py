"""close-period reads the open holds of a period: ``invoicing_close`` may select
``invoice_holds (customer_id, billing_period, source_topic, released_at)``.

Revision ID: 0026
Revises: 0025
Create Date: 2027-05-02

close-period no longer reads the records the invoicing workers have already stored
(docs/decisions/0011-close-by-stored-offsets.md): it finds their customers in the
database. A record of the period that a worker dead-lettered instead of storing leaves
no usage row, only a hold naming the period; the close finds that customer through the
hold, as its topic scan used to find it through the record, so the worker is told to
close it and finds it held. Only the four columns the query needs are granted (no
reason, no event id: they quote the bad record).
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
