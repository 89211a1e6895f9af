-- The first hour (issue #18): what a worker's app registers, and finished jobs by time.
--
-- registered_types: each worker publishes its app's job types at start-up (the newest
-- registration of a type wins), so a producer without the app (`coldbrew submit`,
-- Client.submit without app=, POST /jobs) routes a type to the lane its job declares.
-- A table of its own, not columns of job_types: job_types holds the operators'
-- fleet-wide caps (`coldbrew types set`), written by people and read by every capped
-- claim; registrations are written by workers at every start and read by submitters.
--
-- jobs_finished: `coldbrew stats --since` counts the jobs finished in a window, a range
-- scan of this index instead of a pass over the whole table.

CREATE TABLE registered_types (
    name             text PRIMARY KEY,
    queue            text NOT NULL,
    max_attempts     integer CHECK (max_attempts >= 1),
    timeout_seconds  double precision CHECK (timeout_seconds > 0),
    is_process       boolean NOT NULL,
    worker_id        text NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
