"""Rating (docs/rating.md): metered usage, subscriptions, the published price book, rated lines.

Revision ID: 0005
Revises: 0004
Create Date: 2027-02-01

* ``metered_usage`` — one row per ``usage.metered`` event id, written by the
  invoicing worker like ``usage_lines``: the same id with the same payload is a
  duplicate, with another payload a conflict (dead-lettered, the stored row
  kept). ``properties`` holds the text map, ``decimals`` the decimal map (decimal
  strings in canonical form, so "10" and "10.0" are one payload).
  ``billing_period`` is the UTC month of ``event_time``.
* ``subscription_events`` — one row per ``subscription.*`` event id (same rules):
  the customer's subscription history, in partition order (its source offsets).
* ``billable_metrics`` and ``plan_versions`` — the published price book
  (``invoicing plans publish``), one row per immutable entry; ``definition`` is the
  entry's canonical JSON, ``content_sha256`` its SHA-256. A trigger refuses any
  UPDATE or DELETE: a published entry never changes.
* ``invoice_charges`` — the rated charge lines of an invoice revision, each taxed
  (one tax line per invoice line); ``detail`` is the line as the invoice event
  states it (``ChargeSummary``: days, tiers, package, proration, true-up).
* ``invoices.rating`` — a rated invoice's ``RatingSummary`` (segments, pre-priced
  lines per plan version, metered events rated, the exact sum of the lines); NULL
  for an invoice of pre-priced lines only.

Every row read from Kafka keeps its source coordinates (docs/design.md, invariant 6).
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

PERIOD_CHECK = "~ '^[0-9]{4}-(0[1-9]|1[0-2])$'"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE TABLE metered_usage (
        event_id           text PRIMARY KEY,
        customer_id        text NOT NULL,
        billing_period     text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        metric             text NOT NULL,
        event_time         timestamptz NOT NULL,
        properties         jsonb NOT NULL,
        decimals           jsonb NOT NULL,
        payload_sha256     text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        recorded_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX metered_usage_customer_period
        ON metered_usage (customer_id, billing_period, source_topic, source_partition, source_offset);

    CREATE TABLE subscription_events (
        event_id           text PRIMARY KEY,
        customer_id        text NOT NULL,
        event_type         text NOT NULL CHECK (event_type IN
                               ('subscription.started', 'subscription.changed', 'subscription.ended')),
        plan_code          text,
        plan_version       integer CHECK (plan_version >= 1),
        effective_at       timestamptz NOT NULL,
        reason             text,
        payload_sha256     text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        recorded_at        timestamptz NOT NULL DEFAULT now(),
        CHECK ((event_type = 'subscription.ended') = (plan_code IS NULL AND plan_version IS NULL))
    );
    CREATE INDEX subscription_events_customer
        ON subscription_events (customer_id, source_topic, source_partition, source_offset);

    CREATE TABLE billable_metrics (
        metric_code        text PRIMARY KEY,
        definition         jsonb NOT NULL,
        content_sha256     text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{{64}}$'),
        published_at       timestamptz NOT NULL,
        published_by       text NOT NULL
    );

    CREATE TABLE plan_versions (
        plan_code          text NOT NULL,
        plan_version       integer NOT NULL CHECK (plan_version >= 1),
        plan_name          text,
        effective_from     date NOT NULL,
        currency           char(3) NOT NULL,
        definition         jsonb NOT NULL,
        content_sha256     text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{{64}}$'),
        published_at       timestamptz NOT NULL,
        published_by       text NOT NULL,
        PRIMARY KEY (plan_code, plan_version)
    );

    -- A published entry is immutable: a price change is a new version.
    CREATE FUNCTION price_book_entry_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'published price book entries are immutable (% on %)', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
    END;
    $$;
    CREATE TRIGGER billable_metrics_immutable BEFORE UPDATE OR DELETE ON billable_metrics
        FOR EACH ROW EXECUTE FUNCTION price_book_entry_immutable();
    CREATE TRIGGER plan_versions_immutable BEFORE UPDATE OR DELETE ON plan_versions
        FOR EACH ROW EXECUTE FUNCTION price_book_entry_immutable();

    CREATE TABLE invoice_charges (
        invoice_id         uuid NOT NULL REFERENCES invoices (invoice_id),
        line_no            integer NOT NULL CHECK (line_no >= 1),
        line_id            uuid NOT NULL,
        plan_code          text NOT NULL,
        plan_version       integer NOT NULL,
        charge_code        text NOT NULL,
        charge_model       text NOT NULL,
        description        text NOT NULL,
        metric             text,
        group_value        text,
        unit               text,
        quantity           numeric,
        unit_price         numeric,
        amount             numeric NOT NULL,
        detail             jsonb NOT NULL,
        tax_code           text NOT NULL,
        tax_rate           numeric NOT NULL,
        tax                numeric NOT NULL,
        PRIMARY KEY (invoice_id, line_no),
        UNIQUE (invoice_id, line_id)
    );

    ALTER TABLE invoices ADD COLUMN rating jsonb;
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
