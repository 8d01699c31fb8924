"""Lineage of the API key: ``key_id`` on ``usage_lines``, ``usage_staging`` and ``metered_usage``.

Revision ID: 0017
Revises: 0016
Create Date: 2027-04-02

The ingest edge puts the id of the API key that sent an event in the record header
``invoicing_key_id`` (streams/core/domain/codec.py ``KEY_ID_HEADER``); the invoicing worker
stores it with the usage the event stands for (streams/apps/invoicing/ingest.py,
streams/core/billing/store/usage.py ``_USAGE_COLUMNS``, the COPY into ``usage_staging``),
so a usage line can be traced to the key that sent it (docs/security.md "API keys"). NULL:
the record came from another producer (the FOCUS importer, a replay, a record from before
this migration). The key id is 8 hex characters today; 64 characters bound what a header
may bring. Nullable columns without a default: adding them rewrites no table. Grants are
unchanged (the worker and the replay role have table-level INSERT on these tables,
streams/adapters/postgres/grants.py); ``grants.apply`` converges the column grants of the
roles that have some.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    ALTER TABLE usage_lines ADD COLUMN key_id text CHECK (length(key_id) BETWEEN 1 AND 64);
    ALTER TABLE usage_staging ADD COLUMN key_id text;
    ALTER TABLE metered_usage ADD COLUMN key_id text CHECK (length(key_id) BETWEEN 1 AND 64);
    COMMENT ON COLUMN usage_lines.key_id IS
        'The API key that sent the event through the ingest edge (lineage); NULL: another producer';
    COMMENT ON COLUMN metered_usage.key_id IS
        'The API key that sent the event through the ingest edge (lineage); NULL: another producer';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
