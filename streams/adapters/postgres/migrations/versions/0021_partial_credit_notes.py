"""Partial credit notes: ``credit_notes.kind``, ``credit_note_lines`` and
``credit_invoice_lines()`` (docs/invoices.md "Partial credit notes").

Revision ID: 0021
Revises: 0020
Create Date: 2027-04-02

- ``credit_notes.kind``: ``full`` (a replay's correction: it credits what is still open on
  the revision and supersedes it) or ``partial`` (an operator credits part of some lines;
  the revision stays ``issued``). The unique constraint on ``credit_notes.invoice_id`` of
  migration 0001 becomes a partial unique index: at most one **full** note per revision,
  any number of partial ones.
- ``credit_note_lines``: one row per credited invoice line of a partial note (the credit
  note, the invoice line ``(invoice_id, line_no)``, the amount and the tax credited).
  Immutable like ``credit_notes`` (``immutable_row_guard()`` of migration 0006).
- ``round_half_even(numeric, integer)``: half-even rounding to a number of decimals, the
  result at that scale (PostgreSQL's ``round(numeric, int)`` rounds half away from zero).
- ``credit_invoice_lines(invoice_id uuid, credit_note_id uuid, lines jsonb, reason text,
  minor_unit integer, outbox_id uuid, topic text, source text)``: ``SECURITY DEFINER``
  (runs as the owner, fixed ``search_path``), ``EXECUTE`` granted to ``invoicing_admin``
  alone (``streams/adapters/postgres/grants.py`` ``FUNCTIONS``). ``lines`` is a JSON
  array of ``{"line_no": int, "amount": "decimal text"}``. In one transaction: lock the
  invoice row (``FOR UPDATE``: a second credit, a void or a replay's supersede of the
  same revision waits for it), refuse unless the revision is ``issued`` and has
  pre-priced lines (``invoice_lines``; a rated invoice's charge lines are not creditable
  yet), then per line the creditable-amount rule of docs/invoices.md:

  * a line's creditable amount is its amount rounded half-even to the currency's minor
    unit, less what earlier partial notes credited on it; its creditable tax is its
    charged tax rounded the same way, less what was credited;
  * a credit of the whole open amount takes the whole open tax (the exact remainder);
    otherwise the tax is ``round_half_even(line tax * amount / line amount)``, never
    more than the open tax;
  * per invoice: the note's subtotal and tax, with every earlier partial note's, never
    exceed the revision's ``subtotal`` and ``tax_total``.

  It then takes the next gapless ``CN-<period>`` number (``document_counters``, the
  series the replay's full notes use), inserts the note and its lines and writes the
  ``credit_note.issued`` outbox row (with ``lines``;
  schemas/billing.invoices.v1/credit_note.issued.schema.json). Returns the number,
  subtotal, tax total, total and issue time.

Refusals (SQLSTATE, for streams/apps/ops/credit.py): ``P0002`` no such invoice;
``55000`` the revision is not ``issued``; ``0A000`` a rated invoice; ``22023`` a bad
reason, an empty, malformed or repeated line list, an unknown line, a non-positive
amount or one with more decimals than the currency's minor unit; ``23514``
(check_violation) more than what is still creditable, per line or per invoice.
"""

from alembic import op

from streams.adapters.postgres import grants

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
    ALTER TABLE credit_notes
        ADD COLUMN kind text NOT NULL DEFAULT 'full' CHECK (kind IN ('full', 'partial'));
    ALTER TABLE credit_notes DROP CONSTRAINT credit_notes_invoice_id_key;
    CREATE UNIQUE INDEX credit_notes_one_full ON credit_notes (invoice_id) WHERE kind = 'full';
    CREATE INDEX credit_notes_invoice ON credit_notes (invoice_id);

    CREATE TABLE credit_note_lines (
        credit_note_id     uuid NOT NULL REFERENCES credit_notes (credit_note_id),
        invoice_id         uuid NOT NULL,
        line_no            integer NOT NULL,
        amount             numeric NOT NULL CHECK (amount > 0),
        tax                numeric NOT NULL CHECK (tax >= 0),
        PRIMARY KEY (credit_note_id, line_no),
        FOREIGN KEY (invoice_id, line_no) REFERENCES invoice_lines (invoice_id, line_no)
    );
    CREATE INDEX credit_note_lines_line ON credit_note_lines (invoice_id, line_no);
    CREATE TRIGGER credit_note_lines_immutable BEFORE UPDATE OR DELETE ON credit_note_lines
        FOR EACH ROW EXECUTE FUNCTION immutable_row_guard();
    CREATE TRIGGER credit_note_lines_no_truncate BEFORE TRUNCATE ON credit_note_lines
        FOR EACH STATEMENT EXECUTE FUNCTION immutable_row_guard();

    CREATE FUNCTION round_half_even(x numeric, places integer) RETURNS numeric
        LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog AS $$
        SELECT round(CASE
            WHEN abs(x * power(10::numeric, places) - trunc(x * power(10::numeric, places)))
                 = 0.5
            THEN (trunc(x * power(10::numeric, places))
                  + CASE WHEN mod(trunc(x * power(10::numeric, places)), 2) = 0
                         THEN 0 ELSE sign(x) END)
                 / power(10::numeric, places)
            ELSE x
        END, places)
    $$;

    CREATE FUNCTION credit_invoice_lines(
        p_invoice_id uuid, p_credit_note_id uuid, p_lines jsonb, p_reason text,
        p_minor_unit integer, p_outbox_id uuid, p_topic text, p_source text
    ) RETURNS TABLE (credit_note_number text, subtotal numeric, tax_total numeric,
                     total numeric, issued_at timestamptz)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    DECLARE
        inv record;
        ln record;
        item jsonb;
        amt numeric;
        tx numeric;
        open_amount numeric;
        open_tax numeric;
        line_numbers integer[] := '{}';
        credited jsonb := '[]'::jsonb;
        note_subtotal numeric := 0;
        note_tax numeric := 0;
        done_subtotal numeric;
        done_tax numeric;
        seq bigint;
        number text;
        at timestamptz := now();
        at_text text := to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    BEGIN
        IF p_reason IS NULL OR length(btrim(p_reason)) < 1 OR length(p_reason) > 2000 THEN
            RAISE EXCEPTION 'a credit note needs a reason of 1 to 2000 characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_reason ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]' THEN
            RAISE EXCEPTION 'the reason of a credit note may not hold control or bidi characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_minor_unit IS NULL OR p_minor_unit < 0 OR p_minor_unit > 4 THEN
            RAISE EXCEPTION 'the minor unit must be 0 to 4 decimals'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_lines IS NULL OR jsonb_typeof(p_lines) <> 'array' OR jsonb_array_length(p_lines) = 0
        THEN
            RAISE EXCEPTION 'a credit note needs at least one line'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT i.invoice_id, i.invoice_number, i.revision, i.status, i.customer_id,
               i.customer_name, i.email, i.billing_period, trim(i.currency) AS currency,
               i.subtotal, i.tax_total, i.rating
          INTO inv
          FROM public.invoices i WHERE i.invoice_id = p_invoice_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'invoice % does not exist', p_invoice_id
                USING ERRCODE = 'no_data_found';
        END IF;
        IF inv.status <> 'issued' THEN
            RAISE EXCEPTION 'invoice % (%, revision %) is %: only an issued invoice can be credited',
                inv.invoice_id, inv.invoice_number, inv.revision, inv.status
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF inv.rating IS NOT NULL THEN
            RAISE EXCEPTION 'invoice % is a rated invoice: its charge lines cannot be credited in part',
                inv.invoice_number USING ERRCODE = 'feature_not_supported';
        END IF;

        FOR item IN SELECT value FROM jsonb_array_elements(p_lines) LOOP
            IF jsonb_typeof(item) <> 'object' OR jsonb_typeof(item -> 'line_no') <> 'number'
               OR jsonb_typeof(item -> 'amount') <> 'string'
               OR (item ->> 'amount') !~ '^[0-9]{1,18}(\.[0-9]{1,20})?$'
               OR (item ->> 'line_no') !~ '^[0-9]{1,9}$' THEN
                RAISE EXCEPTION 'a credited line is {"line_no": <line>, "amount": "<decimal>"}: %',
                    item USING ERRCODE = 'invalid_parameter_value';
            END IF;
            amt := (item ->> 'amount')::numeric;
            IF amt <= 0 THEN
                RAISE EXCEPTION 'line %: the amount credited must be positive',
                    item ->> 'line_no' USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF amt <> round(amt, p_minor_unit) THEN
                RAISE EXCEPTION 'line %: % has more than % decimals (the minor unit of %)',
                    item ->> 'line_no', amt, p_minor_unit, inv.currency
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF (item ->> 'line_no')::integer = ANY (line_numbers) THEN
                RAISE EXCEPTION 'line % is named twice', item ->> 'line_no'
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            line_numbers := line_numbers || (item ->> 'line_no')::integer;
            SELECT l.line_no, l.amount, l.tax,
                   round_half_even(l.amount, p_minor_unit) AS creditable_amount,
                   round_half_even(l.tax, p_minor_unit) AS creditable_tax,
                   coalesce((SELECT sum(c.amount) FROM public.credit_note_lines c
                              WHERE c.invoice_id = l.invoice_id AND c.line_no = l.line_no), 0)
                       AS credited_amount,
                   coalesce((SELECT sum(c.tax) FROM public.credit_note_lines c
                              WHERE c.invoice_id = l.invoice_id AND c.line_no = l.line_no), 0)
                       AS credited_tax
              INTO ln
              FROM public.invoice_lines l
             WHERE l.invoice_id = inv.invoice_id AND l.line_no = (item ->> 'line_no')::integer;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'invoice % has no line %', inv.invoice_number, item ->> 'line_no'
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            open_amount := ln.creditable_amount - ln.credited_amount;
            open_tax := ln.creditable_tax - ln.credited_tax;
            IF amt > open_amount THEN
                RAISE EXCEPTION 'line % of invoice %: % is more than the % still creditable (charged %, credited %)',
                    ln.line_no, inv.invoice_number, amt, open_amount, ln.creditable_amount,
                    ln.credited_amount USING ERRCODE = 'check_violation';
            END IF;
            IF amt = open_amount THEN
                tx := open_tax;
            ELSIF ln.creditable_amount = 0 THEN
                tx := 0;
            ELSE
                tx := least(round_half_even(ln.creditable_tax * amt / ln.creditable_amount,
                                            p_minor_unit), open_tax);
            END IF;
            note_subtotal := note_subtotal + amt;
            note_tax := note_tax + tx;
            credited := credited || jsonb_build_object(
                'line_no', ln.line_no, 'amount', amt::text, 'tax', tx::text);
        END LOOP;

        SELECT coalesce(sum(c.subtotal), 0), coalesce(sum(c.tax_total), 0)
          INTO done_subtotal, done_tax
          FROM public.credit_notes c WHERE c.invoice_id = inv.invoice_id;
        IF note_subtotal > inv.subtotal - done_subtotal THEN
            RAISE EXCEPTION 'invoice %: % is more than the % still creditable on it (subtotal %, credited %)',
                inv.invoice_number, note_subtotal, inv.subtotal - done_subtotal, inv.subtotal,
                done_subtotal USING ERRCODE = 'check_violation';
        END IF;
        IF note_tax > inv.tax_total - done_tax THEN
            RAISE EXCEPTION 'invoice %: tax % is more than the % still creditable on it (tax %, credited %)',
                inv.invoice_number, note_tax, inv.tax_total - done_tax, inv.tax_total, done_tax
                USING ERRCODE = 'check_violation';
        END IF;

        INSERT INTO public.document_counters (series, last_value)
        VALUES ('CN-' || inv.billing_period, 1)
        ON CONFLICT (series) DO UPDATE SET last_value = document_counters.last_value + 1
        RETURNING last_value INTO seq;
        number := 'CN-' || inv.billing_period || '-' || lpad(seq::text, 6, '0');

        INSERT INTO public.credit_notes (credit_note_id, credit_note_number, invoice_id,
            customer_id, billing_period, currency, subtotal, tax_total, total, reason,
            issued_at, kind)
        VALUES (p_credit_note_id, number, inv.invoice_id, inv.customer_id, inv.billing_period,
                inv.currency, note_subtotal, note_tax, note_subtotal + note_tax, p_reason, at,
                'partial');
        INSERT INTO public.credit_note_lines (credit_note_id, invoice_id, line_no, amount, tax)
        SELECT p_credit_note_id, inv.invoice_id, (e ->> 'line_no')::integer,
               (e ->> 'amount')::numeric, (e ->> 'tax')::numeric
          FROM jsonb_array_elements(credited) e;
        INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, ce_source,
                                   ce_time, document_id)
        VALUES (
            p_outbox_id, p_topic, inv.customer_id, 'credit_note.issued',
            jsonb_build_object(
                'schema_version', 1,
                'credit_note_id', p_credit_note_id::text,
                'credit_note_number', number,
                'invoice_id', inv.invoice_id::text,
                'invoice_number', inv.invoice_number,
                'revision', inv.revision,
                'customer_id', inv.customer_id,
                'customer_name', inv.customer_name,
                'email', inv.email,
                'billing_period', inv.billing_period,
                'currency', inv.currency,
                'subtotal', note_subtotal::text,
                'tax_total', note_tax::text,
                'total', (note_subtotal + note_tax)::text,
                'reason', left(p_reason, 500),
                'issued_at', at_text,
                'lines', credited),
            p_source, at_text, p_credit_note_id);
        RETURN QUERY SELECT number, note_subtotal, note_tax, note_subtotal + note_tax, at;
    END $$;
    COMMENT ON FUNCTION credit_invoice_lines(uuid, uuid, jsonb, text, integer, uuid, text, text) IS
        'Credit part of an issued invoice revision''s lines: never more than what is still '
        'creditable per line and per invoice; the credit note, its lines and the '
        'credit_note.issued outbox row in one transaction, under the invoice row''s lock.';
    """
    )
    grants.apply(op.get_bind(), only_existing=True)


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
