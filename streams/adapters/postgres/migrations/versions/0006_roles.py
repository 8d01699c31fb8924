"""Least privilege: issued documents immutable (triggers), outbox pruning through one
function, and the grants of every privilege role (streams/adapters/postgres/grants.py).

Revision ID: 0006
Revises: 0004
Create Date: 2027-02-01

Runs as the owner (``postgres.owner``), which owns every table and function here. The
privilege roles (``invoicing_worker``, ``invoicing_email``, ``invoicing_close``,
``invoicing_replay``, ``invoicing_operator``, ``invoicing_admin``, ``invoicing_cdc``) are
cluster-wide and created beforehand by provisioning (``invoicing stack up``,
:mod:`streams.adapters.postgres.provision`); the migration stops with a message naming the
missing ones otherwise.

**The rule of the triggers** (docs/design.md "Database roles": no runtime role can change an
issued invoice's amounts, lines or number, or delete invoices, credit notes or outbox
rows). They apply to every role, the owner included; grants alone already keep the
runtime roles out, the triggers hold even where a grant is wrong:

- ``invoices``: no ``DELETE``, no ``TRUNCATE``; an ``UPDATE`` may change ``status``
  only, and only ``issued`` → ``superseded`` or ``issued`` → ``voided`` (what a replay
  does); any other column changed, or any other transition, is refused.
- ``invoice_lines``: no ``UPDATE``, ``DELETE`` or ``TRUNCATE``; an ``INSERT`` is accepted
  only from the transaction that inserted the line's invoice (its ``xmin`` is still in
  progress), so no line is ever added to an issued
  invoice. ``invoice_line_guard()`` is generic: ``invoice_charges`` (the rated charge
  lines of migration 0005 on the rating branch), when it exists, gets the same triggers.
- ``credit_notes``: no ``UPDATE``, ``DELETE`` or ``TRUNCATE``.
- ``outbox``: no ``UPDATE`` or ``TRUNCATE``. Rows are deleted only by retention:
  ``prune_outbox(older_than interval)``, ``SECURITY DEFINER`` (runs as the owner, with a
  fixed ``search_path``), refuses less than 7 days and deletes only rows older than
  what it was given; ``EXECUTE`` is granted to ``invoicing_admin`` alone.

Refusals raise SQLSTATE 42501 (``insufficient_privilege``, psycopg's
``errors.InsufficientPrivilege``), like a missing grant, with a message naming the rule.
A reviewed data fix as the owner disables a trigger explicitly (``ALTER TABLE … DISABLE
TRIGGER …``), which is DDL and leaves a trace.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

FLOOR_DAYS = grants.OUTBOX_PRUNE_FLOOR_DAYS


def upgrade() -> None:
    names = ", ".join(f"'{role.name}'" for role in grants.PRIVILEGE_ROLES)
    op.execute(
        f"""
    DO $$
    DECLARE missing text;
    BEGIN
        SELECT string_agg(r, ', ') INTO missing
          FROM unnest(ARRAY[{names}]) AS r
         WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r);
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'privilege roles missing: %', missing
                USING HINT = 'provision the cluster first (invoicing stack up, or the '
                             'statements of streams/adapters/postgres/provision.py run by a DBA)';
        END IF;
    END $$;
    """
    )
    op.execute(
        """
    CREATE FUNCTION issued_invoice_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE changed text;
    BEGIN
        IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
            RAISE EXCEPTION 'invoices are never deleted (% on invoices refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'a wrong invoice gets a credit note and a new revision (invoicing replay)';
        END IF;
        SELECT string_agg(n.key, ', ' ORDER BY n.key) INTO changed
          FROM jsonb_each(to_jsonb(NEW)) AS n
         WHERE n.key <> 'status' AND n.value IS DISTINCT FROM (to_jsonb(OLD) -> n.key);
        IF changed IS NOT NULL THEN
            RAISE EXCEPTION 'invoice % is immutable: change of % refused', OLD.invoice_number, changed
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'only status changes, issued -> superseded or voided';
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status
           AND NOT (OLD.status = 'issued' AND NEW.status IN ('superseded', 'voided')) THEN
            RAISE EXCEPTION 'invoice % status % -> % refused', OLD.invoice_number, OLD.status, NEW.status
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'the only transitions are issued -> superseded and issued -> voided';
        END IF;
        RETURN NEW;
    END $$;

    CREATE FUNCTION immutable_row_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '% rows are immutable (% refused)', TG_TABLE_NAME, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END $$;

    -- A line may be inserted only by the transaction that inserts its invoice: the lines of
    -- an issued invoice never change, and none is added later. The invoice's row is ours
    -- when its inserting transaction (xmin) is still in progress: a visible row whose
    -- inserter has not committed can only be ours (or a subtransaction's of ours). xmin is
    -- 32 bits; it is widened against our own xid8 by the signed 32-bit distance, the way
    -- PostgreSQL widens xids, so an epoch wrap-around changes nothing. Generic over any
    -- table of an invoice's lines (a column invoice_id).
    CREATE FUNCTION invoice_line_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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
            RAISE EXCEPTION 'invoice % is issued: adding a line to it is refused (an issued invoice''s lines never change)',
                NEW.invoice_id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END $$;

    CREATE TRIGGER invoices_immutable BEFORE UPDATE OR DELETE ON invoices
        FOR EACH ROW EXECUTE FUNCTION issued_invoice_guard();
    CREATE TRIGGER invoices_no_truncate BEFORE TRUNCATE ON invoices
        FOR EACH STATEMENT EXECUTE FUNCTION issued_invoice_guard();

    CREATE TRIGGER invoice_lines_insert BEFORE INSERT ON invoice_lines
        FOR EACH ROW EXECUTE FUNCTION invoice_line_guard();
    CREATE TRIGGER invoice_lines_immutable BEFORE UPDATE OR DELETE ON invoice_lines
        FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
    CREATE TRIGGER invoice_lines_no_truncate BEFORE TRUNCATE ON invoice_lines
        FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();

    -- The rated charge lines of an invoice (migration 0005 of the rating wiring, when it is
    -- in the chain before this one) are lines of an issued invoice like invoice_lines.
    DO $$ BEGIN
        IF to_regclass('public.invoice_charges') IS NOT NULL THEN
            CREATE TRIGGER invoice_charges_insert BEFORE INSERT ON invoice_charges
                FOR EACH ROW EXECUTE FUNCTION invoice_line_guard();
            CREATE TRIGGER invoice_charges_immutable BEFORE UPDATE OR DELETE ON invoice_charges
                FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
            CREATE TRIGGER invoice_charges_no_truncate BEFORE TRUNCATE ON invoice_charges
                FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();
        END IF;
    END $$;

    CREATE TRIGGER credit_notes_immutable BEFORE UPDATE OR DELETE ON credit_notes
        FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
    CREATE TRIGGER credit_notes_no_truncate BEFORE TRUNCATE ON credit_notes
        FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();

    CREATE TRIGGER outbox_immutable BEFORE UPDATE ON outbox
        FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
    CREATE TRIGGER outbox_no_truncate BEFORE TRUNCATE ON outbox
        FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();
    """
    )
    op.execute(
        f"""
    CREATE FUNCTION prune_outbox(older_than interval) RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE deleted bigint;
    BEGIN
        IF older_than IS NULL OR older_than < interval '{FLOOR_DAYS} days' THEN
            RAISE EXCEPTION 'outbox retention below the floor refused: % < {FLOOR_DAYS} days', older_than
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        DELETE FROM public.outbox WHERE created_at < now() - older_than;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN deleted;
    END $$;
    COMMENT ON FUNCTION prune_outbox(interval) IS
        'Outbox retention: deletes rows older than older_than (at least {FLOOR_DAYS} days); '
        'runs as the owner so that no runtime role needs DELETE on the outbox.';
    """
    )
    # The grants of the tables that exist at this point of the chain; `invoicing db migrate`
    # converges every table on the matrix after upgrading (streams.adapters.postgres.migrate).
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
