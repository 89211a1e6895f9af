-- Cron schedules (worker/cron.py): one row per schedule, upserted by every worker
-- that declares it at start-up. last_tick is the watermark: every tick up to it
-- has been decided (fired, caught up or skipped), and it only moves forward, by a
-- compare-and-swap in the transaction that inserts the ticks' jobs, so one worker
-- makes each decision. seen_at is refreshed by the declaring workers; a row no
-- live worker has declared for a while shows as orphaned in `coldbrew cron list`.
-- Independent of any other migration: it only adds this table.

CREATE TABLE cron_schedules (
    name              text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    expression        text NOT NULL,
    tz                text NOT NULL,
    type              text NOT NULL,
    args              jsonb NOT NULL DEFAULT '{}'::jsonb,
    queue             text NOT NULL,
    tenant            text NOT NULL,
    priority          smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    max_attempts      integer NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds   double precision CHECK (timeout_seconds > 0),
    catch_up          text NOT NULL CHECK (catch_up IN ('latest', 'all', 'none')),
    max_catch_up      integer NOT NULL CHECK (max_catch_up BETWEEN 1 AND 1000),
    paused            boolean NOT NULL DEFAULT false,
    last_tick         timestamptz NOT NULL,
    last_job_id       text,
    seen_at           timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
