"""invoice_voids and void_invoice(): an operator voids an issued invoice revision.

Revision ID: 0020
Revises: 0018
Create Date: 2027-04-01

A void is a fact of its own, never undone (docs/invoices.md "Void"):

- ``invoice_voids``: one row per voided revision (the primary key is the invoice id), the
  reason, who (``session_user``: the login that called) and when (``now()``, the
  transaction's time), and the id of its outbox row. Immutable like ``credit_notes``
  (``immutable_row_guard()`` of migration 0006: no ``UPDATE``, ``DELETE``, ``TRUNCATE``).
- ``void_invoice(invoice_id uuid, reason text, outbox_id uuid, topic text, source text)``:
  ``SECURITY DEFINER`` (runs as the owner, fixed ``search_path``), ``EXECUTE`` granted to
  ``invoicing_admin`` alone (``streams/adapters/postgres/grants.py`` ``FUNCTIONS``). In one
  transaction: lock the invoice row (``FOR UPDATE``, so a concurrent replay's supersede
  and a second void wait for it), refuse unless its status is ``issued`` (the current
  revision), insert the ``invoice_voids`` row, set the status ``issued`` → ``voided``
  (the only transition migration 0006's trigger allows besides the supersede), and write
  the ``invoice.voided`` outbox row whose payload the function builds from the stored
  invoice (schemas/billing.invoices.v1/invoice.voided.schema.json), so a caller cannot
  put anything in the event but the reason. Returns the void's time and its who.

Refusals (SQLSTATE, for streams/apps/ops/void.py): ``P0002`` no such invoice;
``55000`` (object_not_in_prerequisite_state) the invoice is not ``issued`` (voided
already, superseded); ``22023`` (invalid_parameter_value) an empty, too long (over 2000
characters) or control-character reason.

"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
    CREATE TABLE invoice_voids (
        invoice_id         uuid PRIMARY KEY REFERENCES invoices (invoice_id),
        reason             text NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000),
        voided_by          text NOT NULL,
        voided_at          timestamptz NOT NULL,
        outbox_id          uuid NOT NULL UNIQUE
    );

    CREATE TRIGGER invoice_voids_immutable BEFORE UPDATE OR DELETE ON invoice_voids
        FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
    CREATE TRIGGER invoice_voids_no_truncate BEFORE TRUNCATE ON invoice_voids
        FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();

    CREATE FUNCTION void_invoice(
        p_invoice_id uuid, p_reason text, p_outbox_id uuid, p_topic text, p_source text
    ) RETURNS TABLE (voided_at timestamptz, voided_by text)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE
        inv record;
        at timestamptz := now();
        who text := session_user;
        at_text text := to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    BEGIN
        IF p_reason IS NULL OR length(p_reason) < 1 OR length(p_reason) > 2000 THEN
            RAISE EXCEPTION 'a void needs a reason of 1 to 2000 characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_reason ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]' THEN
            RAISE EXCEPTION 'the reason of a void may not hold control or bidi characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT i.invoice_id, i.invoice_number, i.revision, i.status, i.customer_id,
               i.billing_period
          INTO inv
          FROM public.invoices i WHERE i.invoice_id = p_invoice_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'invoice % does not exist', p_invoice_id
                USING ERRCODE = 'no_data_found';
        END IF;
        IF inv.status <> 'issued' THEN
            RAISE EXCEPTION 'invoice % (%, revision %) is %: only an issued invoice can be voided',
                inv.invoice_id, inv.invoice_number, inv.revision, inv.status
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        INSERT INTO public.invoice_voids (invoice_id, reason, voided_by, voided_at, outbox_id)
        VALUES (inv.invoice_id, p_reason, who, at, p_outbox_id);
        UPDATE public.invoices SET status = 'voided' WHERE invoice_id = inv.invoice_id;
        INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, ce_source,
                                   ce_time, document_id)
        VALUES (
            p_outbox_id, p_topic, inv.customer_id, 'invoice.voided',
            jsonb_build_object(
                'schema_version', 1,
                'invoice_id', inv.invoice_id::text,
                'invoice_number', inv.invoice_number,
                'revision', inv.revision,
                'customer_id', inv.customer_id,
                'billing_period', inv.billing_period,
                'reason', p_reason,
                'voided_at', at_text),
            p_source, at_text, inv.invoice_id);
        RETURN QUERY SELECT at, who;
    END $$;
    COMMENT ON FUNCTION void_invoice(uuid, text, uuid, text, text) IS
        'Void an issued invoice revision: invoice_voids row, status issued -> voided and the '
        'invoice.voided outbox row in one transaction; runs as the owner so that no runtime '
        'role needs UPDATE on invoices.';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
