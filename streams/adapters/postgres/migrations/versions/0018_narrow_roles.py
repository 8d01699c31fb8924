"""Roles no wider than their code: a pricing role publishes the price book, the database
stamps who published and when, and an invoice is superseded only through a definer function.

Revision ID: 0018
Revises: 0017
Create Date: 2027-04-02

Before (docs/security.md "Roles"):

- the admin role, which also releases holds and resets fences, published price books, and
  ``published_by`` / ``published_at`` were what the client sent;
- the replay role had ``UPDATE (status)`` on ``invoices``: it could set any issued invoice
  to ``voided`` (which no code does), or ``superseded`` without any successor revision.

After:

- ``invoicing_pricing`` (login ``postgres.pricing``, ``invoicing plans publish``) is the only
  role that may insert into ``billable_metrics`` and ``plan_versions``, and only the entry's
  own columns (streams/adapters/postgres/grants.py); the admin role has no privilege on them;
- ``price_book_published_stamp()``, a ``BEFORE INSERT`` trigger of both tables, sets
  ``published_by`` to ``session_user`` (the login, not a role it may have switched to) and
  ``published_at`` to ``now()`` (the transaction's start), whoever inserts, the owner
  included: a client's values are overwritten;
- the replay role loses ``UPDATE`` on ``invoices``; ``supersede_invoice(uuid)``
  (``SECURITY DEFINER``, fixed ``search_path``, ``EXECUTE`` to the replay role only) sets
  an ``issued`` revision ``superseded`` and nothing else, and returns false when it is no
  longer ``issued`` (a concurrent replay won);
- ``lock_issued_invoice(text, text)`` (definer, ``EXECUTE`` to the replay role): the
  ``SELECT … FOR UPDATE`` of a customer's issued revision, which needs an UPDATE grant;
- ``superseded_invoice_has_successor()``, a constraint trigger ``DEFERRABLE INITIALLY
  DEFERRED`` on the status change, refuses at commit, to everyone, an invoice superseded
  without a later revision of the same customer and period that names it in
  ``supersedes_invoice_id``. It is checked at commit because the successor can only be
  inserted after its predecessor left ``issued`` (the unique index ``invoices_one_current``).

Voiding gets its own definer function elsewhere (not here); until then no runtime role may
void. Refusals: 42501 (``insufficient_privilege``) for a missing grant, 23000 (``integrity_constraint_violation``) at commit for a
superseding without its successor.

Needs the privilege role ``invoicing_pricing``: provision the cluster first
(``invoicing stack up``, ``invoicing db provision`` or the statements of
streams/adapters/postgres/provision.py run by a DBA).
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
    DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'invoicing_pricing') THEN
            RAISE EXCEPTION 'privilege role invoicing_pricing missing'
                USING HINT = 'provision the cluster first (invoicing stack up, invoicing db '
                             'provision, or the statements of streams/adapters/postgres/provision.py)';
        END IF;
    END $$;

    CREATE FUNCTION price_book_published_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.published_by := session_user;
        NEW.published_at := now();
        RETURN NEW;
    END $$;
    CREATE TRIGGER billable_metrics_published_stamp BEFORE INSERT ON billable_metrics
        FOR EACH ROW EXECUTE FUNCTION price_book_published_stamp();
    CREATE TRIGGER plan_versions_published_stamp BEFORE INSERT ON plan_versions
        FOR EACH ROW EXECUTE FUNCTION price_book_published_stamp();

    CREATE FUNCTION supersede_invoice(superseded uuid) RETURNS boolean
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE found uuid;
    BEGIN
        UPDATE public.invoices SET status = 'superseded'
         WHERE invoice_id = superseded AND status = 'issued'
        RETURNING invoice_id INTO found;
        RETURN found IS NOT NULL;
    END $$;
    COMMENT ON FUNCTION supersede_invoice(uuid) IS
        'issued -> superseded; the successor revision is checked at commit '
        '(docs/security.md "Roles")';

    -- SELECT ... FOR UPDATE needs an UPDATE grant, which the replay no longer has: it
    -- locks the customer's issued revision through this function (the lock is the
    -- transaction's, whoever takes it).
    CREATE FUNCTION lock_issued_invoice(customer text, period text)
        RETURNS TABLE (invoice_id text, revision integer)
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
        SELECT i.invoice_id::text, i.revision FROM public.invoices i
         WHERE i.customer_id = customer AND i.billing_period = period AND i.status = 'issued'
           FOR UPDATE
    $$;

    CREATE FUNCTION superseded_invoice_has_successor() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    BEGIN
        IF NEW.status = 'superseded' AND NOT EXISTS (
            SELECT FROM public.invoices s
             WHERE s.supersedes_invoice_id = NEW.invoice_id
               AND s.customer_id = NEW.customer_id
               AND s.billing_period = NEW.billing_period
               AND s.revision > NEW.revision
        ) THEN
            RAISE EXCEPTION 'invoice % superseded without a successor revision', NEW.invoice_number
                USING ERRCODE = 'integrity_constraint_violation',
                      HINT = 'the revision that supersedes it is inserted in the same transaction';
        END IF;
        RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER invoices_superseded_has_successor
        AFTER UPDATE OF status ON invoices
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.status = 'superseded' AND OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION superseded_invoice_has_successor();
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
