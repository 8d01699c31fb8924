"""republish_document(): ``reconcile --republish`` without an INSERT grant on the outbox.

Revision ID: 0022
Revises: 0021
Create Date: 2027-04-03

- ``republish_document(document_id uuid)``: ``SECURITY DEFINER`` (runs as the owner, fixed
  ``search_path``), ``EXECUTE`` granted to ``invoicing_admin`` alone
  (``streams/adapters/postgres/grants.py`` ``FUNCTIONS``). It copies the newest outbox row
  still kept for ``document_id`` (an invoice revision or a credit note) into a new row:
  a fresh id (``gen_random_uuid()``), the same topic (``aggregatetype``, still held by the
  CHECK ``outbox_routes_to_invoices`` of migration 0015), key, type and payload,
  ``ce_source`` ``/ops/reconcile`` and ``ce_time`` now (UTC). Everything published comes
  from what the database holds; the caller names the document only. Returns the new row's
  id, or NULL when no outbox row of the document is kept (pruned: nothing to copy).
- The admin role loses ``INSERT`` on ``outbox`` (grants matrix): it may no longer write an
  outbox row of its own making (docs/security.md "The outbox").
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
    CREATE FUNCTION republish_document(p_document_id uuid) RETURNS uuid
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE
        kept record;
        new_id uuid := gen_random_uuid();
    BEGIN
        SELECT o.aggregatetype, o.aggregateid, o.type, o.payload, o.content_type
          INTO kept
          FROM public.outbox o WHERE o.document_id = p_document_id
         ORDER BY o.created_at DESC, o.id LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, ce_source,
                                   ce_time, content_type, document_id)
        VALUES (
            new_id, kept.aggregatetype, kept.aggregateid, kept.type, kept.payload,
            '/ops/reconcile',
            to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            kept.content_type, p_document_id);
        RETURN new_id;
    END $$;
    COMMENT ON FUNCTION republish_document(uuid) IS
        'Republish a document: copy its newest kept outbox row under a new id; runs as the '
        'owner so that no admin login needs INSERT on outbox (docs/security.md).';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
