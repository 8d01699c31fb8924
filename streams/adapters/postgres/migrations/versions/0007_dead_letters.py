"""dead_letters: which records were dead-lettered, so that none is dead-lettered twice.

Revision ID: 0007
Revises: 0006
Create Date: 2027-02-01

One row per dead-lettered record, keyed by its source coordinates (topic,
partition, offset). The consumer produces the dead letter and waits for the
broker's acknowledgement (never inside a transaction), then writes this row **in
the transaction that moves past the record** (the invoicing worker's batch
transaction, with the record's holds), and only then commits the source offset
(streams/core/billing/dead_letters.py). On every delivery of a batch the consumer first
reads the rows of its offsets: a record found here is skipped — it is not
dead-lettered again, and a record the database could not write is not tried
again. No record bytes are stored (PostgreSQL could not hold all of them): they
stay in the source topic at these coordinates. A duplicate on the dead-letter
topic remains possible only when the process dies, or the database fails, between
the acknowledgement and the commit (at-least-once; deduplicate on the
``dlq.source.*`` headers).

``kind``: ``invalid`` (does not decode), ``conflict`` (an event id stored with
another payload), ``rejected`` (a close marker whose invoice a rule refused),
``unwritable`` (valid, but the database refused it: a bound the contract lacks).
``customers``: the customers it holds (none: unattributed).

Numbered 0007 because 0005 and 0006 were taken by work on parallel branches;
chained to 0006 (the roles) since the merge of main; its grants are
streams/adapters/postgres/grants.py's ``dead_letters`` entry.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    CREATE TABLE dead_letters (
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        dlq_topic          text NOT NULL,
        kind               text NOT NULL
                           CHECK (kind IN ('invalid', 'conflict', 'rejected', 'unwritable')),
        reason             text NOT NULL,
        event_id           text,
        customers          text[] NOT NULL DEFAULT '{}',
        recorded_at        timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (source_topic, source_partition, source_offset)
    );
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
