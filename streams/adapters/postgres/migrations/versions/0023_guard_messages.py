"""A guard trigger's refusal names the rule it enforces: the trigger functions of
migration 0006 replaced with the same behaviour and clearer messages.

Revision ID: 0023
Revises: 0022
Create Date: 2027-04-10

The refusals keep SQLSTATE 42501 (``insufficient_privilege``, psycopg's
``errors.InsufficientPrivilege``: the CLI maps it to "not allowed" and tests match on it),
but a bare 42501 reads as a missing grant. Each message now states the rule first
("issued invoices are immutable: …", docs/roles.md "Issued documents are immutable") and a
HINT says what to do instead. Behaviour (what is refused, when) is unchanged:
``issued_invoice_guard()``, ``immutable_row_guard()`` and ``invoice_line_guard()`` are
replaced in place (``CREATE OR REPLACE FUNCTION``), so their triggers and grants stay.
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_RULES = "see docs/roles.md, Issued documents are immutable"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE OR REPLACE FUNCTION issued_invoice_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE changed text;
    BEGIN
        IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
            RAISE EXCEPTION 'invoices are never deleted: % on invoices refused (rule: issued invoices are immutable)', TG_OP
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'a wrong invoice gets a credit note and a new revision (invoicing replay) '
                             'or is voided (invoicing invoice void); {_RULES}';
        END IF;
        SELECT string_agg(n.key, ', ' ORDER BY n.key) INTO changed
          FROM jsonb_each(to_jsonb(NEW)) AS n
         WHERE n.key <> 'status' AND n.value IS DISTINCT FROM (to_jsonb(OLD) -> n.key);
        IF changed IS NOT NULL THEN
            RAISE EXCEPTION 'issued invoices are immutable: invoice % change of % refused; only status issued -> superseded/voided is allowed', OLD.invoice_number, changed
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'correct an invoice with a credit note and a new revision (invoicing replay); {_RULES}';
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status
           AND NOT (OLD.status = 'issued' AND NEW.status IN ('superseded', 'voided')) THEN
            RAISE EXCEPTION 'issued invoices are immutable: invoice % status % -> % refused; only status issued -> superseded/voided is allowed', OLD.invoice_number, OLD.status, NEW.status
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'superseded and voided are final; {_RULES}';
        END IF;
        RETURN NEW;
    END $$;

    CREATE OR REPLACE FUNCTION immutable_row_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_TABLE_NAME = 'outbox' THEN
            RAISE EXCEPTION 'outbox rows are immutable: % refused (rows are only appended, and deleted only by retention)', TG_OP
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'retention deletes through prune_outbox(interval), as invoicing_admin; {_RULES}';
        END IF;
        RAISE EXCEPTION '% rows are immutable: % refused (rows of issued documents never change and are never deleted)', TG_TABLE_NAME, TG_OP
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'a wrong document is corrected by a new one (credit note, new revision), never edited; {_RULES}';
    END $$;

    CREATE OR REPLACE FUNCTION invoice_line_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        issued_by xid;
        ref bigint;
        d bigint;
    BEGIN
        SELECT xmin INTO issued_by FROM invoices WHERE invoice_id = NEW.invoice_id;
        IF NOT FOUND THEN
            RETURN NEW;  -- no invoice: the foreign key refuses the row with its own error
        END IF;
        ref := pg_current_xact_id()::text::bigint;
        d := ((issued_by::text::bigint - (ref & 4294967295)) % 4294967296 + 4294967296) % 4294967296;
        IF d >= 2147483648 THEN
            d := d - 4294967296;
        END IF;
        IF ref + d < 3 OR pg_xact_status((ref + d)::text::xid8) IS DISTINCT FROM 'in progress' THEN
            RAISE EXCEPTION 'issued invoices are immutable: invoice % is issued, adding a line to it is refused (lines are inserted only with their invoice)',
                NEW.invoice_id
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'a missing charge goes on a new revision (invoicing replay); {_RULES}';
        END IF;
        RETURN NEW;
    END $$;
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
