"""replay_runs and replay_results: the state of ``invoicing replay`` runs, so an apply can resume.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``replay_runs`` has one row per run (dry run or apply) of
``invoicing replay YYYY-MM`` (streams/apps/replay/): the window it re-reads
(``start_offsets`` from ``offsets_for_times(period start - margin)`` and the
``end_offsets`` captured when the run began, JSON objects ``{"<partition>":
offset}``), its Kafka consumer group, the lease holder and fencing number of
its latest attempt, and its status. At most one *apply* run per period is
``running`` (a partial unique index): a crashed apply is resumed by the next
``--apply`` of the period, over the same offsets, so it sees exactly the same
events (and sends the tax service the same documents under the same
idempotency keys).

``replay_results`` has one row per (run, customer) that an apply run finished,
written in the same fenced transaction as the customer's credit note and new
revision; a resumed run skips the customers it finds here. ``detail`` is the
customer's difference report (JSON, money as strings).
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

PERIOD_CHECK = "~ '^[0-9]{4}-(0[1-9]|1[0-2])$'"


def upgrade() -> None:
    op.execute(
        f"""
    CREATE TABLE replay_runs (
        run_id              text PRIMARY KEY,
        billing_period      text NOT NULL CHECK (billing_period {PERIOD_CHECK}),
        mode                text NOT NULL CHECK (mode IN ('dry_run', 'apply')),
        status              text NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
        topic               text NOT NULL,
        consumer_group      text NOT NULL,
        window_start        timestamptz NOT NULL,
        start_offsets       jsonb NOT NULL,
        end_offsets         jsonb NOT NULL,
        holder              text NOT NULL,
        lease_fencing_token bigint NOT NULL,
        attempts            integer NOT NULL DEFAULT 1 CHECK (attempts >= 1),
        events_read         bigint,
        summary             jsonb,
        last_error          text,
        started_at          timestamptz NOT NULL DEFAULT now(),
        updated_at          timestamptz NOT NULL DEFAULT now(),
        finished_at         timestamptz
    );
    -- At most one unfinished apply per billing period: the next --apply resumes it.
    CREATE UNIQUE INDEX replay_runs_one_open_apply
        ON replay_runs (billing_period) WHERE mode = 'apply' AND status = 'running';

    CREATE TABLE replay_results (
        run_id              text NOT NULL REFERENCES replay_runs (run_id),
        customer_id         text NOT NULL,
        outcome             text NOT NULL
                            CHECK (outcome IN ('unchanged', 'corrected', 'invoiced', 'skipped', 'failed')),
        old_invoice_id      uuid,
        new_invoice_id      uuid,
        credit_note_id      uuid,
        detail              jsonb NOT NULL,
        recorded_at         timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, customer_id)
    );
    """
    )


def downgrade() -> None:
    raise NotImplementedError("forward-only migrations")
