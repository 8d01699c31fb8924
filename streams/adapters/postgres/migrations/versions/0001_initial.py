"""Initial schema: usage, invoices, outbox, fencing, holds, email deliveries.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Money columns are NUMERIC without scale (exact, any precision). Billing periods
are ``YYYY-MM`` text. Every row that comes from Kafka keeps its source
coordinates (topic, partition, offset) for traceability (docs/design.md, invariant 6).
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

PERIOD_CHECK = "~ '^[0-9]{4}-(0[1-9]|1[0-2])$'"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE TABLE customers (
        customer_id        text PRIMARY KEY,
        name               text NOT NULL,
        email              text NOT NULL,
        currency           char(3) NOT NULL,
        billing_account_id text,
        event_id           text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        updated_at         timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE usage_lines (
        event_id           text PRIMARY KEY,
        customer_id        text NOT NULL,
        billing_period     text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        amount             numeric NOT NULL,
        currency           char(3) NOT NULL,
        quantity           numeric,
        unit               text,
        consumed_quantity  numeric,
        consumed_unit      text,
        sku_id             text,
        description        text,
        region_id          text,
        charge_category    text,
        provider           text,
        event_time         timestamptz NOT NULL,
        payload_sha256     text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        recorded_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX usage_lines_customer_period ON usage_lines (customer_id, billing_period);

    -- Close markers received (billing_period.closed), one row per event id.
    CREATE TABLE period_closes (
        event_id           text PRIMARY KEY,
        customer_id        text NOT NULL,
        billing_period     text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        reason             text NOT NULL,
        outcome            text NOT NULL CHECK (outcome IN ('invoiced', 'already_invoiced', 'held')),
        invoice_id         uuid,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        received_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX period_closes_customer_period ON period_closes (customer_id, billing_period);

    -- Gapless document numbers: one counter row per series, incremented inside the
    -- transaction that writes the document, so a rollback also rolls back the number.
    CREATE TABLE document_counters (
        series             text PRIMARY KEY,
        last_value         bigint NOT NULL CHECK (last_value >= 0)
    );

    CREATE TABLE invoices (
        invoice_id         uuid PRIMARY KEY,
        invoice_number     text NOT NULL UNIQUE,
        customer_id        text NOT NULL,
        billing_period     text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        revision           integer NOT NULL CHECK (revision >= 1),
        status             text NOT NULL CHECK (status IN ('issued', 'superseded', 'voided')),
        customer_name      text NOT NULL,
        email              text NOT NULL,
        currency           char(3) NOT NULL,
        line_count         integer NOT NULL CHECK (line_count >= 0),
        subtotal           numeric NOT NULL,
        tax_total          numeric NOT NULL,
        total              numeric NOT NULL CHECK (total = subtotal + tax_total),
        taxes              jsonb NOT NULL,
        close_event_id     text NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        first_offset       bigint,
        last_offset        bigint,
        close_offset       bigint NOT NULL,
        fence_group        text,
        fence_generation   integer,
        fence_member       text,
        lease_fencing_token bigint,
        supersedes_invoice_id uuid REFERENCES invoices (invoice_id),
        issued_at          timestamptz NOT NULL DEFAULT now(),
        UNIQUE (customer_id, billing_period, revision)
    );
    -- At most one current revision per (customer, billing period).
    CREATE UNIQUE INDEX invoices_one_current
        ON invoices (customer_id, billing_period) WHERE status = 'issued';

    CREATE TABLE invoice_lines (
        invoice_id         uuid NOT NULL REFERENCES invoices (invoice_id),
        line_no            integer NOT NULL,
        event_id           text NOT NULL,
        amount             numeric NOT NULL,
        quantity           numeric,
        unit               text,
        description        text,
        sku_id             text,
        region_id          text,
        tax_code           text NOT NULL,
        tax_rate           numeric NOT NULL,
        tax                numeric NOT NULL,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        PRIMARY KEY (invoice_id, line_no),
        UNIQUE (invoice_id, event_id)
    );

    CREATE TABLE credit_notes (
        credit_note_id     uuid PRIMARY KEY,
        credit_note_number text NOT NULL UNIQUE,
        invoice_id         uuid NOT NULL UNIQUE REFERENCES invoices (invoice_id),
        customer_id        text NOT NULL,
        billing_period     text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        currency           char(3) NOT NULL,
        subtotal           numeric NOT NULL,
        tax_total          numeric NOT NULL,
        total              numeric NOT NULL CHECK (total = subtotal + tax_total),
        reason             text NOT NULL,
        issued_at          timestamptz NOT NULL DEFAULT now()
    );

    -- Transactional outbox, streamed by Debezium's outbox EventRouter.
    -- aggregatetype routes the topic; aggregateid is the record key (customer id);
    -- the ce_* columns become CloudEvents headers (binary content mode).
    CREATE TABLE outbox (
        id                 uuid PRIMARY KEY,
        aggregatetype      text NOT NULL,
        aggregateid        text NOT NULL,
        type               text NOT NULL,
        payload            jsonb NOT NULL,
        ce_specversion     text NOT NULL DEFAULT '1.0',
        ce_source          text NOT NULL,
        ce_time            text NOT NULL,
        content_type       text NOT NULL DEFAULT 'application/json',
        document_id        uuid NOT NULL,
        created_at         timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX outbox_created_at ON outbox (created_at);
    CREATE INDEX outbox_document ON outbox (document_id);

    -- Fencing tokens of partition owners (docs/design.md "Ownership and fencing").
    CREATE TABLE partition_fences (
        group_id           text NOT NULL,
        topic              text NOT NULL,
        partition          integer NOT NULL,
        generation         integer NOT NULL,
        member_id          text NOT NULL,
        updated_at         timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (group_id, topic, partition)
    );

    -- Fencing numbers of Redis leases (docs/design.md "Redis leases"): a job's writes are
    -- accepted only while its number is the highest seen for the lease.
    CREATE TABLE lease_fences (
        lease_name         text PRIMARY KEY,
        fencing_token      bigint NOT NULL,
        holder             text NOT NULL,
        updated_at         timestamptz NOT NULL DEFAULT now()
    );

    -- A customer's invoicing held because one of its records was dead-lettered.
    CREATE TABLE invoice_holds (
        hold_id            bigserial PRIMARY KEY,
        customer_id        text NOT NULL,
        billing_period     text CHECK (billing_period {PERIOD_CHECK}),
        reason             text NOT NULL,
        event_id           text,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        created_at         timestamptz NOT NULL DEFAULT now(),
        released_at        timestamptz,
        released_by        text,
        release_note       text,
        UNIQUE (source_topic, source_partition, source_offset)
    );
    CREATE INDEX invoice_holds_open ON invoice_holds (customer_id) WHERE released_at IS NULL;

    -- One row per email: claimed before sending, marked sent after (docs/design.md "Email").
    CREATE TABLE email_deliveries (
        event_id           text PRIMARY KEY,
        document_key       text NOT NULL UNIQUE,
        document_type      text NOT NULL,
        document_id        uuid NOT NULL,
        customer_id        text NOT NULL,
        recipient          text NOT NULL,
        message_id         text NOT NULL,
        status             text NOT NULL CHECK (status IN ('sending', 'sent', 'skipped')),
        skip_reason        text,
        attempts           integer NOT NULL DEFAULT 1,
        source_topic       text NOT NULL,
        source_partition   integer NOT NULL,
        source_offset      bigint NOT NULL,
        claimed_at         timestamptz NOT NULL DEFAULT now(),
        sent_at            timestamptz
    );
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
