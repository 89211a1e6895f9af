-- The acting dashboard (issue #17): sessions, the audit log, attempts, and search.
--
-- dashboard_sessions: a browser's sign-in. The cookie holds a random token; only its
-- SHA-256 is stored, so a leaked table signs nobody in. Logout sets revoked_at; a
-- session past expires_at is refused (and pruned at the next sign-in).
--
-- audit_log: every action taken from the dashboard (who, when, what, on which job or
-- tenant, and what came of it), shown on the job's page and on /dashboard/audit.
--
-- job_attempts: one row per attempt that ended without success (retrying, failed,
-- dead, released or reaped back to queued), written by a trigger whose WHEN clause
-- lets every other update (claims, heartbeats, successes) pass without a call, so
-- the hot path writes nothing more. The current attempt is the jobs row itself.
-- Its rows go with their job (ON DELETE CASCADE: retention prunes them by the
-- primary key's leading job_id, one index probe per pruned job).
--
-- jobs_search_*: keyset pagination of the job search, newest first; one index per
-- access path the search uses (every job, one tenant's, one status's).

CREATE TABLE dashboard_sessions (
    token_hash   bytea PRIMARY KEY,
    tenant       text,
    actor        text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);

CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    tenant    text,
    action    text NOT NULL,
    job_id    text,
    target    text NOT NULL,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb,
    outcome   text NOT NULL
);

CREATE INDEX audit_log_job ON audit_log (job_id, at) WHERE job_id IS NOT NULL;
CREATE INDEX audit_log_at ON audit_log (at);

CREATE TABLE job_attempts (
    job_id         text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt        integer NOT NULL,
    outcome        text NOT NULL,
    error_kind     text,
    error_message  text,
    started_at     timestamptz,
    ended_at       timestamptz NOT NULL DEFAULT now(),
    worker_id      text,
    PRIMARY KEY (job_id, attempt, ended_at)
);

CREATE FUNCTION record_job_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_attempts (job_id, attempt, outcome, error_kind, error_message,
                              started_at, worker_id)
    VALUES (NEW.id, OLD.attempt, NEW.status::text, NEW.error_kind,
            left(NEW.error_message, 2000), OLD.started_at, OLD.worker_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_ended AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND NEW.status <> 'succeeded')
    EXECUTE FUNCTION record_job_attempt();

CREATE INDEX jobs_search_created ON jobs (created_at, id);
CREATE INDEX jobs_search_tenant ON jobs (tenant, created_at, id);
CREATE INDEX jobs_search_status ON jobs (status, created_at, id);
