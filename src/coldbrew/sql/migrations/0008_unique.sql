-- Unique jobs (issue #15): a job type or submission with unique_for holds a key (a
-- hash of its type and chosen parts) while its job is in unique_states and younger
-- than unique_for. job_unique maps each key to the job holding it; a submission
-- takes the key in the statement that inserts its job (INSERT ... ON CONFLICT DO
-- UPDATE ... WHERE the holder's window passed or it left the states), so two
-- producers at once create one job. job_aliases maps the message id of a raw AMQP
-- duplicate to the job it duplicated. Both rows go with their job (ON DELETE CASCADE),
-- so pruning a job frees its key. Non-unique jobs never touch either table.

CREATE TABLE job_unique (
    key         text PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_unique_job ON job_unique (job_id);

CREATE TABLE job_aliases (
    id          text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_aliases_job ON job_aliases (job_id);
