"""Draft invoices: a grace period per customer (and per plan version), ``invoice_drafts``.

Revision ID: 0024
Revises: 0023
Create Date: 2027-04-17

- ``customers.invoice_grace_hours`` (``numeric``, NULL: the customer states none): the
  grace period of ``customer.upserted``'s optional ``invoice_grace_hours`` (hours, a
  decimal, 0 to 8760). The worker writes it with the rest of the customer.
- ``invoice_drafts``: one row per (customer, billing period, revision) whose close made a
  *draft* because its grace period is above 0 (docs/invoices.md "Drafts and
  finalisation"). It holds what the draft states (rated and taxed as an invoice would be,
  but no number), the close marker it was built from, the watermark (the offset of the
  partition it was last re-rated up to), when the grace period ends (UTC), the partition
  fence that wrote it and, once finalised, when and under which number. It is no invoice:
  ``invoices`` keeps only issued documents, so nothing that reads ``invoices`` (the email
  sender, reconcile, the replay, the portal) sees a draft. ``status`` moves ``draft`` →
  ``finalized`` only (trigger ``invoice_draft_guard()``), rows are never deleted.
- ``period_closes.outcome`` may be ``drafted`` (the close made a draft).

Grants (``streams/adapters/postgres/grants.py``): the worker reads, inserts and updates
the draft's figures and status; the operator and the admin read (``status``,
``invoice show``, ``invoice finalize``'s check); the worker updates the new customer column.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
    ALTER TABLE customers ADD COLUMN invoice_grace_hours numeric
        CHECK (invoice_grace_hours >= 0 AND invoice_grace_hours <= 8760);

    ALTER TABLE period_closes DROP CONSTRAINT period_closes_outcome_check;
    ALTER TABLE period_closes ADD CONSTRAINT period_closes_outcome_check
        CHECK (outcome IN ('invoiced', 'already_invoiced', 'held', 'drafted'));

    CREATE TABLE invoice_drafts (
        invoice_id          uuid NOT NULL,
        customer_id         text NOT NULL,
        billing_period      text NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
        revision            integer NOT NULL CHECK (revision >= 1),
        status              text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'finalized')),
        grace_hours         numeric NOT NULL CHECK (grace_hours > 0),
        grace_source        text NOT NULL CHECK (grace_source IN ('customer', 'plan')),
        grace_ends_at       timestamptz NOT NULL,
        currency            char(3) NOT NULL,
        line_count          integer NOT NULL,
        subtotal            numeric NOT NULL,
        tax_total           numeric NOT NULL,
        total               numeric NOT NULL,
        rerated             integer NOT NULL DEFAULT 0,
        close_event_id      text NOT NULL,
        lease_fencing_token bigint,
        source_topic        text NOT NULL,
        source_partition    integer NOT NULL,
        close_offset        bigint NOT NULL,
        watermark_offset    bigint NOT NULL,
        fence_generation    integer,
        fence_member        text,
        created_at          timestamptz NOT NULL DEFAULT now(),
        updated_at          timestamptz NOT NULL DEFAULT now(),
        finalized_at        timestamptz,
        invoice_number      text,
        PRIMARY KEY (invoice_id),
        UNIQUE (customer_id, billing_period, revision)
    );
    CREATE INDEX invoice_drafts_open ON invoice_drafts (source_topic, source_partition)
        WHERE status = 'draft';
    COMMENT ON TABLE invoice_drafts IS
        'Invoices in their grace period: rated and taxed, no number, no event, no email '
        '(docs/invoices.md, Drafts and finalisation).';

    CREATE FUNCTION invoice_draft_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
            RAISE EXCEPTION 'invoice drafts are never deleted: % refused', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF OLD.status = 'finalized' THEN
            RAISE EXCEPTION 'a finalized draft never changes (invoice %)', OLD.invoice_id
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'the issued invoice is in invoices; see docs/invoices.md';
        END IF;
        IF NEW.invoice_id <> OLD.invoice_id OR NEW.customer_id <> OLD.customer_id
           OR NEW.billing_period <> OLD.billing_period OR NEW.revision <> OLD.revision THEN
            RAISE EXCEPTION 'a draft keeps its identity (invoice %)', OLD.invoice_id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER invoice_drafts_guard BEFORE UPDATE OR DELETE ON invoice_drafts
        FOR EACH ROW EXECUTE FUNCTION invoice_draft_guard();
    CREATE TRIGGER invoice_drafts_no_truncate BEFORE TRUNCATE ON invoice_drafts
        FOR EACH STATEMENT EXECUTE FUNCTION invoice_draft_guard();
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    op.execute(
        """
    DROP TABLE invoice_drafts;
    DROP FUNCTION invoice_draft_guard();
    ALTER TABLE period_closes DROP CONSTRAINT period_closes_outcome_check;
    ALTER TABLE period_closes ADD CONSTRAINT period_closes_outcome_check
        CHECK (outcome IN ('invoiced', 'already_invoiced', 'held'));
    ALTER TABLE customers DROP COLUMN invoice_grace_hours;
    """
    )
