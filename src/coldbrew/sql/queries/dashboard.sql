-- The acting dashboard (issue #17): sessions, the audit log, attempts, search, charts,
-- and the two actions the CLI has no statement for (retry a failed job, replay one
-- tenant's dead jobs by reason).

-- name: session_create
-- A new dashboard session, its token stored hashed ($1 token sha256, $2 tenant or null, $3 actor, $4 lifetime in seconds)
INSERT INTO dashboard_sessions (token_hash, tenant, actor, expires_at)
VALUES ($1, $2, $3, now() + make_interval(secs => $4))
RETURNING expires_at;

-- name: session_get
-- The live session of a token hash: not revoked, not expired ($1 token sha256)
SELECT tenant, actor, created_at, expires_at FROM dashboard_sessions
WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now();

-- name: session_revoke
-- Log out: the session is refused from now on ($1 token sha256); returns whether one was live
UPDATE dashboard_sessions SET revoked_at = now()
WHERE token_hash = $1 AND revoked_at IS NULL
RETURNING true;

-- name: session_prune
-- Forget sessions that expired a day ago or more (revoked ones expire too)
DELETE FROM dashboard_sessions WHERE expires_at < now() - interval '1 day';

-- name: audit_insert
-- Record one dashboard action ($1 actor, $2 actor's tenant or null, $3 action, $4 job id or null, $5 target, $6 detail json, $7 outcome)
INSERT INTO audit_log (actor, tenant, action, job_id, target, detail, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, at;

-- name: audit_for_job
-- A job's audit entries, oldest first ($1 job id, $2 limit)
SELECT id, at, actor, tenant, action, job_id, target, detail, outcome
FROM audit_log WHERE job_id = $1
ORDER BY at, id
LIMIT $2;

-- name: audit_recent
-- The newest audit entries, of actors of one tenant or (null) of every one ($1 tenant or null, $2 limit)
SELECT id, at, actor, tenant, action, job_id, target, detail, outcome
FROM audit_log WHERE ($1::text IS NULL OR tenant = $1)
ORDER BY at DESC, id DESC
LIMIT $2;

-- name: job_attempts_of
-- A job's ended attempts (those that did not succeed), oldest first ($1 job id)
SELECT attempt, outcome, error_kind, error_message, started_at, ended_at, worker_id
FROM job_attempts WHERE job_id = $1
ORDER BY ended_at, attempt;

-- name: search_jobs_all
-- Job search over every job, newest first, keyset paged ($1 tenant or null, $2 status or null, $3 type or null, $4 from or null, $5 to or null, $6 error text or null, $7 cursor created_at or null, $8 cursor id, $9 limit)
SELECT id, type, queue, tenant, status, attempt, max_attempts, progress, created_at,
       finished_at, error_kind, left(error_message, 300) AS error_message, dead_reason
FROM jobs
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::job_status IS NULL OR status = $2)
  AND ($3::text IS NULL OR type = $3)
  AND created_at >= coalesce($4::timestamptz, '-infinity')
  AND created_at < coalesce($5::timestamptz, 'infinity')
  AND ($6::text IS NULL
       OR position(lower($6) IN lower(coalesce(error_kind, '') || ' ' || coalesce(error_message, '')
                                      || ' ' || coalesce(dead_reason, ''))) > 0)
  AND (created_at, id) < (coalesce($7::timestamptz, 'infinity'), $8::text)
ORDER BY created_at DESC, id DESC
LIMIT $9;

-- name: search_jobs_tenant
-- Job search within one tenant (jobs_search_tenant), newest first, keyset paged ($1 tenant, $2 status or null, $3 type or null, $4 from or null, $5 to or null, $6 error text or null, $7 cursor created_at or null, $8 cursor id, $9 limit)
SELECT id, type, queue, tenant, status, attempt, max_attempts, progress, created_at,
       finished_at, error_kind, left(error_message, 300) AS error_message, dead_reason
FROM jobs
WHERE tenant = $1
  AND ($2::job_status IS NULL OR status = $2)
  AND ($3::text IS NULL OR type = $3)
  AND created_at >= coalesce($4::timestamptz, '-infinity')
  AND created_at < coalesce($5::timestamptz, 'infinity')
  AND ($6::text IS NULL
       OR position(lower($6) IN lower(coalesce(error_kind, '') || ' ' || coalesce(error_message, '')
                                      || ' ' || coalesce(dead_reason, ''))) > 0)
  AND (created_at, id) < (coalesce($7::timestamptz, 'infinity'), $8::text)
ORDER BY tenant DESC, created_at DESC, id DESC
LIMIT $9;

-- name: search_jobs_status
-- Job search within one status (jobs_search_status), optionally one tenant's, newest first, keyset paged ($1 tenant or null, $2 status, $3 type or null, $4 from or null, $5 to or null, $6 error text or null, $7 cursor created_at or null, $8 cursor id, $9 limit)
SELECT id, type, queue, tenant, status, attempt, max_attempts, progress, created_at,
       finished_at, error_kind, left(error_message, 300) AS error_message, dead_reason
FROM jobs
WHERE status = $2::job_status
  AND ($1::text IS NULL OR tenant = $1)
  AND ($3::text IS NULL OR type = $3)
  AND created_at >= coalesce($4::timestamptz, '-infinity')
  AND created_at < coalesce($5::timestamptz, 'infinity')
  AND ($6::text IS NULL
       OR position(lower($6) IN lower(coalesce(error_kind, '') || ' ' || coalesce(error_message, '')
                                      || ' ' || coalesce(dead_reason, ''))) > 0)
  AND (created_at, id) < (coalesce($7::timestamptz, 'infinity'), $8::text)
ORDER BY status DESC, created_at DESC, id DESC
LIMIT $9;

-- name: retry_job
-- Run a failed or dead job again with a fresh budget, as dlq_replay does; attempt keeps counting so fencing holds ($1 job id, $2 fresh attempts, $3 tenant or null)
UPDATE jobs AS j
SET status = 'queued', max_attempts = j.attempt - j.snoozes + $2, dead_reason = NULL,
    finished_at = NULL, run_at = now(), publish_after = now(), cancel_requested = false,
    updated_at = now()
WHERE j.id = $1 AND j.status IN ('failed', 'dead') AND ($3::text IS NULL OR j.tenant = $3)
RETURNING j.id;

-- name: replay_dead_of_tenant
-- Replay dead jobs whose reason or error contains a text, of one tenant or (null) every one, as dlq_replay ($1 reason text, $2 tenant or null, $3 limit, $4 fresh attempts)
UPDATE jobs AS j
SET status = 'queued', max_attempts = j.attempt - j.snoozes + $4, dead_reason = NULL,
    finished_at = NULL, run_at = now(), publish_after = now(), cancel_requested = false,
    updated_at = now()
WHERE j.id IN (
    SELECT id FROM jobs
    WHERE status = 'dead'
      AND ($2::text IS NULL OR tenant = $2)
      AND position(lower($1) IN lower(coalesce(dead_reason, '') || ' '
                                      || coalesce(error_kind, '') || ' '
                                      || coalesce(error_message, ''))) > 0
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
RETURNING j.id;

-- name: chart_throughput
-- Jobs finished per lane and minute since a moment, of one tenant or every one ($1 since, $2 tenant or null)
SELECT queue, floor(extract(epoch FROM finished_at - $1) / 60)::int AS minute, count(*) AS count
FROM jobs
WHERE finished_at >= $1 AND status IN ('succeeded', 'failed', 'dead', 'cancelled')
  AND ($2::text IS NULL OR tenant = $2)
GROUP BY 1, 2;

-- name: chart_backlog_edges
-- Changes of each lane's waiting count per minute since a moment: +1 when a job began to wait (or was waiting at the start), -1 when it left ($1 since, $2 tenant or null)
WITH candidates AS (
    SELECT queue, created_at, NULL::timestamptz AS left_at FROM jobs
    WHERE status IN ('queued', 'retrying') AND ($2::text IS NULL OR tenant = $2)
    UNION ALL
    SELECT queue, created_at, started_at FROM jobs
    WHERE status = 'running' AND ($2::text IS NULL OR tenant = $2)
    UNION ALL
    SELECT queue, created_at, coalesce(started_at, finished_at) FROM jobs
    WHERE finished_at >= $1 AND status IN ('succeeded', 'failed', 'dead', 'cancelled')
      AND ($2::text IS NULL OR tenant = $2)
), edges AS (
    SELECT queue, greatest(created_at, $1) AS at, 1 AS delta FROM candidates
    WHERE left_at IS NULL OR left_at >= $1
    UNION ALL
    SELECT queue, left_at, -1 FROM candidates
    WHERE left_at >= $1 AND left_at >= created_at
)
SELECT queue, floor(extract(epoch FROM at - $1) / 60)::int AS minute, sum(delta)::int AS delta
FROM edges
GROUP BY 1, 2;

-- name: job_page_extras
-- What a job's page shows beyond its status JSON: its checkpoint and the worker that holds or held it ($1 job id)
SELECT checkpoint, worker_id FROM jobs WHERE id = $1;

-- name: secret_offer
-- Store a namespace-wide dashboard secret unless one of that name exists: the first API replica's wins ($1 name, $2 random bytes)
INSERT INTO dashboard_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING;

-- name: secret_get
-- The namespace-wide dashboard secret of a name, as every API replica reads it ($1 name)
SELECT secret FROM dashboard_secrets WHERE name = $1;

-- name: children_page
-- The first child jobs of one job for its page, oldest first, by jobs_parent ($1 parent id, $2 limit)
SELECT id, type, status::text AS status FROM jobs
WHERE parent_id = $1
ORDER BY created_at, id
LIMIT $2;

-- name: search_jobs_error
-- Job search by error text through the trigram index jobs_search_error (migration 0016), with any other filter, newest first, keyset paged; the text is matched case-insensitively in the error kind, message and dead reason, as a LIKE pattern the caller escaped ($1 tenant or null, $2 status or null, $3 type or null, $4 from or null, $5 to or null, $6 escaped error text, $7 cursor created_at or null, $8 cursor id, $9 limit)
SELECT id, type, queue, tenant, status, attempt, max_attempts, progress, created_at,
       finished_at, error_kind, left(error_message, 300) AS error_message, dead_reason
FROM jobs
WHERE lower(coalesce(error_kind, '') || ' ' || coalesce(error_message, '') || ' '
            || coalesce(dead_reason, '')) LIKE '%' || lower($6::text) || '%'
  AND (error_kind IS NOT NULL OR error_message IS NOT NULL OR dead_reason IS NOT NULL)
  AND ($1::text IS NULL OR tenant = $1)
  AND ($2::job_status IS NULL OR status = $2)
  AND ($3::text IS NULL OR type = $3)
  AND created_at >= coalesce($4::timestamptz, '-infinity')
  AND created_at < coalesce($5::timestamptz, 'infinity')
  AND (created_at, id) < (coalesce($7::timestamptz, 'infinity'), $8::text)
ORDER BY created_at DESC, id DESC
LIMIT $9;

-- name: custom_plans
-- For the rest of this transaction, plan each statement for its own parameters: a generic plan of the error-text search cannot tell a rare text (the trigram index) from a common one (the newest-first walk stops at once) (no parameters)
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: search_jobs_error_recent
-- The error-text search over the newest rows of its scope only (at most $10, by the scope's newest-first index): when they hold a full page of matches, that page is the search's answer, found without the trigram index, which would fetch and sort every match of a common text ($1 tenant or null, $2 status or null, $3 type or null, $4 from or null, $5 to or null, $6 escaped error text, $7 cursor created_at or null, $8 cursor id, $9 limit, $10 rows looked at)
SELECT id, type, queue, tenant, status, attempt, max_attempts, progress, created_at,
       finished_at, error_kind, left(error_message, 300) AS error_message, dead_reason
FROM (
    SELECT * FROM jobs
    WHERE ($1::text IS NULL OR tenant = $1)
      AND ($2::job_status IS NULL OR status = $2)
      AND ($3::text IS NULL OR type = $3)
      AND created_at >= coalesce($4::timestamptz, '-infinity')
      AND created_at < coalesce($5::timestamptz, 'infinity')
      AND (created_at, id) < (coalesce($7::timestamptz, 'infinity'), $8::text)
    ORDER BY created_at DESC, id DESC
    LIMIT $10
) AS recent
WHERE lower(coalesce(error_kind, '') || ' ' || coalesce(error_message, '') || ' '
            || coalesce(dead_reason, '')) LIKE '%' || lower($6::text) || '%'
ORDER BY created_at DESC, id DESC
LIMIT $9;
