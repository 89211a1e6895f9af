-- Scheduled jobs and snooze (issue #15, part 1). A job with a future run_at has
-- status 'scheduled' and publish_after = run_at: the relay publishes it when due
-- (jobs_publish_due already indexes publish_after) and flips it to 'queued' in the
-- same statement. A snoozed job becomes 'scheduled' again and counts a snooze, which
-- gives back the attempt its claim took: the budget is attempt - snoozes, while
-- attempt itself only grows (it fences every write).
-- ALTER TYPE ... ADD VALUE runs inside coldbrew migrate's per-migration transaction
-- (PostgreSQL >= 12), but the new value cannot be used before that transaction
-- commits, so nothing below names 'scheduled'.

ALTER TYPE job_status ADD VALUE IF NOT EXISTS 'scheduled';

ALTER TABLE jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0 CHECK (snoozes >= 0);
