"""Invoice numbers taken last: the ``INV-<period>`` counter is held only from the number
to the commit, not from the invoice's first row (docs/decisions/0006-gapless-invoice-numbers.md,
"Number last").

Revision ID: 0025
Revises: 0024
Create Date: 2027-04-24

The issuance transaction inserts the invoice under a provisional number,
``PENDING-<invoice id>`` (unique by construction, never committed), writes its lines,
charges and everything else, and only then numbers it with ``number_invoice(uuid, text)``: one
statement that increments the period's counter row and sets the invoice's number. The
counter row's lock, which serialises every issuance of a period, is now held for that
statement, the outbox row, the close record and the commit, instead of the whole
transaction (the lines' ``COPY`` above all).

- ``issued_invoice_guard()`` (replaced in place) lets exactly one more change through: the
  invoice number from ``PENDING-<invoice id>`` to an ``INV-`` number, by the transaction
  that inserted the row (its ``xmin`` is a transaction in progress: the rule
  ``invoice_line_guard()`` already applies to lines, since a visible row whose inserter
  is in progress can only be ours). Every other change of an invoice is refused as
  before; the exception is tested first, since every issuance takes it.
- ``invoice_numbered_at_commit()``, a deferred constraint trigger on insert: an invoice
  whose number is still provisional at commit rolls the transaction back, so no
  unnumbered invoice is ever visible.
- ``number_invoice(uuid, text) RETURNS text``, ``SECURITY DEFINER`` (no runtime role may
  update ``invoices``): numbers the provisional invoice of the given billing period that
  the calling transaction inserted, from the period's counter, and returns the number,
  formatted as ``streams.core.billing.store.invoices.invoice_number`` does (six digits at
  least). Anything else (another period, another transaction's or a numbered invoice)
  is refused and rolls back with the counter. Callable by the worker and the replay
  (``grants.FUNCTIONS``).
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_RULES = "see docs/roles.md, Issued documents are immutable"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE OR REPLACE FUNCTION issued_invoice_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        changed text;
        probe invoices%ROWTYPE;
        issued_by xid;
        ref bigint;
        d bigint;
    BEGIN
        IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
            RAISE EXCEPTION 'invoices are never deleted: % on invoices refused (rule: issued invoices are immutable)', TG_OP
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'a wrong invoice gets a credit note and a new revision (invoicing replay) '
                             'or is voided (invoicing invoice void); {_RULES}';
        END IF;
        -- The one exception, tested first (it is every issuance's path): the issuance
        -- transaction numbers the invoice it inserted. Only the number changed (the row
        -- with its old number is the old row), from the provisional one to an INV- number,
        -- and the row is ours: the xmin test of invoice_line_guard(), inline, since the
        -- guard runs as whoever updates and needs no function of its own to call.
        IF OLD.invoice_number = 'PENDING-' || OLD.invoice_id::text
           AND NEW.invoice_number LIKE 'INV-%' THEN
            probe := NEW;
            probe.invoice_number := OLD.invoice_number;
            IF probe IS NOT DISTINCT FROM OLD THEN
                SELECT xmin INTO issued_by FROM invoices WHERE invoice_id = OLD.invoice_id;
                ref := pg_current_xact_id()::text::bigint;
                d := ((issued_by::text::bigint - (ref & 4294967295)) % 4294967296 + 4294967296) % 4294967296;
                IF d >= 2147483648 THEN
                    d := d - 4294967296;
                END IF;
                IF ref + d >= 3 AND pg_xact_status((ref + d)::text::xid8) = 'in progress' THEN
                    RETURN NEW;
                END IF;
            END IF;
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

    CREATE FUNCTION invoice_numbered_at_commit() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    BEGIN
        IF EXISTS (SELECT FROM public.invoices
                    WHERE invoice_id = NEW.invoice_id AND invoice_number LIKE 'PENDING-%') THEN
            RAISE EXCEPTION 'invoice % of % %: committed without its number', NEW.invoice_id,
                NEW.customer_id, NEW.billing_period
                USING ERRCODE = 'integrity_constraint_violation',
                      HINT = 'the issuance transaction numbers the invoice (number_invoice) before it commits';
        END IF;
        RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER invoices_numbered_at_commit
        AFTER INSERT ON invoices
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.invoice_number LIKE 'PENDING-%')
        EXECUTE FUNCTION invoice_numbered_at_commit();

    CREATE FUNCTION number_invoice(invoice uuid, period text) RETURNS text
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE
        n bigint;
        numbered text;
    BEGIN
        INSERT INTO public.document_counters AS c (series, last_value) VALUES ('INV-' || period, 1)
        ON CONFLICT (series) DO UPDATE SET last_value = c.last_value + 1
        RETURNING c.last_value INTO n;
        numbered := 'INV-' || period || '-' || CASE WHEN n < 1000000 THEN lpad(n::text, 6, '0') ELSE n::text END;
        -- the guard lets the number through only for the transaction that inserted the row
        UPDATE public.invoices SET invoice_number = numbered
         WHERE invoice_id = invoice AND billing_period = period
           AND invoice_number = 'PENDING-' || invoice::text;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'invoice % has no provisional number of period % in this transaction to replace', invoice, period
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'only the transaction that inserted an invoice numbers it, once; {_RULES}';
        END IF;
        RETURN numbered;
    END $$;
    COMMENT ON FUNCTION number_invoice(uuid, text) IS
        'numbers the invoice its own transaction inserted, last before the commit '
        '(docs/decisions/0006-gapless-invoice-numbers.md)';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
