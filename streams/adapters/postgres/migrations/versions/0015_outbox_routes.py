"""The outbox routes only to the invoices topic: a CHECK on ``outbox.aggregatetype``.

Revision ID: 0015
Revises: 0010
Create Date: 2027-04-01

Debezium's EventRouter (connectors/outbox-connector.json, ``route.by.field``) publishes each
outbox row to the topic its ``aggregatetype`` names. Without a constraint, any login that may
insert outbox rows (the worker, replay and admin roles, the owner) could put a record on the
account events topic, e.g. a ``billing_period.closed`` past the edge and the close lease.
``outbox_routes_to_invoices`` allows the invoices topic under any topic prefix of dot-ended
segments (test sandboxes use ``t<hex>.``) and nothing else:
:data:`streams.topics.OUTBOX_ROUTE_PATTERN`, at most 249 characters (Kafka's limit). It holds
for every role, the owner included; ``reconcile --republish`` writes rows to the invoices
topic, so it is unaffected. A refusal raises SQLSTATE 23514 (``check_violation``).

``NOT VALID``: the check applies to every row inserted from now on; rows already in the
table were published when they were inserted (Debezium reads the WAL, never the table
again), and a development database may hold probe rows of earlier test runs, which would
otherwise stop the migration.
"""

from alembic import op

from streams.topics import MAX_TOPIC_NAME, OUTBOX_ROUTE_PATTERN

revision = "0015"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pattern = OUTBOX_ROUTE_PATTERN.replace("'", "''")
    op.execute(
        f"""
    ALTER TABLE outbox ADD CONSTRAINT outbox_routes_to_invoices
        CHECK (length(aggregatetype) <= {MAX_TOPIC_NAME} AND aggregatetype ~ '{pattern}')
        NOT VALID;
    COMMENT ON CONSTRAINT outbox_routes_to_invoices ON outbox IS
        'Debezium routes a row to the topic in aggregatetype: only the invoices topic '
        '(any dot-ended prefix) is allowed (docs/security.md).';
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
