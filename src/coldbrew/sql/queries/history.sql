-- Bounded history (issue #19; migration 0013): the prune service's and `coldbrew prune`'s
-- statements. Which job rows may go at all is job_prunable(jobs), one function, used by the
-- deleting statement and the dry run alike; the retention (status, age) is the rest.

-- name: prune_lock
-- One pruner at a time per namespace: try the namespace's prune lock for the rest of this transaction (no parameters)
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.prune')) AS held;

-- name: prune_jobs
-- Delete up to $3 jobs of status $1 that finished more than $2 seconds ago and job_prunable allows, oldest first (a range of jobs_finished), skipping rows another transaction holds, with their once-guards, unique keys and aliases; returns how many rows of each table went ($1 status, $2 retention seconds, $3 batch size)
WITH doomed AS (
    SELECT j.id FROM jobs AS j
    WHERE j.status = $1::job_status
      AND j.finished_at < now() - make_interval(secs => $2)
      AND job_prunable(j)
    ORDER BY j.finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
once AS (
    DELETE FROM job_once WHERE job_id IN (SELECT id FROM doomed) RETURNING 1
),
keys AS (
    DELETE FROM job_unique WHERE job_id IN (SELECT id FROM doomed) RETURNING 1
),
aliases AS (
    DELETE FROM job_aliases WHERE job_id IN (SELECT id FROM doomed) RETURNING 1
),
gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS jobs,
       (SELECT count(*) FROM once) AS job_once,
       (SELECT count(*) FROM keys) AS job_unique,
       (SELECT count(*) FROM aliases) AS job_aliases;

-- name: count_prunable_jobs
-- The dry run of prune_jobs: per status, how many jobs past their retention job_prunable allows, and how many once-guards, unique keys and aliases go with them ($1 statuses, $2 retention seconds, one per status)
WITH retention AS (
    SELECT * FROM unnest($1::text[], $2::float8[]) AS r(status, seconds)
),
doomed AS (
    SELECT j.id, j.status::text AS status
    FROM retention AS r
    JOIN jobs AS j ON j.status = r.status::job_status
    WHERE j.finished_at < now() - make_interval(secs => r.seconds)
      AND job_prunable(j)
)
SELECT 'jobs' AS table_name, status, count(*) AS count FROM doomed GROUP BY status
UNION ALL
SELECT 'job_once', d.status, count(*) FROM doomed AS d JOIN job_once AS o ON o.job_id = d.id
GROUP BY d.status
UNION ALL
SELECT 'job_unique', d.status, count(*) FROM doomed AS d JOIN job_unique AS u ON u.job_id = d.id
GROUP BY d.status
UNION ALL
SELECT 'job_aliases', d.status, count(*) FROM doomed AS d JOIN job_aliases AS a ON a.job_id = d.id
GROUP BY d.status;

-- name: prune_rejected
-- Delete up to $2 rejected messages received more than $1 seconds ago, oldest first ($1 retention seconds, $2 batch size)
DELETE FROM rejected_messages
WHERE id IN (
    SELECT id FROM rejected_messages
    WHERE received_at < now() - make_interval(secs => $1)
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: count_prunable_rejected
-- The dry run of prune_rejected ($1 retention seconds)
SELECT count(*) FROM rejected_messages WHERE received_at < now() - make_interval(secs => $1);

-- name: prune_rate_buckets
-- Delete up to $2 GCRA buckets whose theoretical arrival time passed more than $1 seconds ago: such a bucket is full, exactly what a missing one is taken to be (lock_rate_buckets creates it full); buckets a claim holds are skipped ($1 idle seconds, $2 batch size)
DELETE FROM rate_buckets
WHERE key IN (
    SELECT key FROM rate_buckets
    WHERE tat < now() - make_interval(secs => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: count_idle_rate_buckets
-- The dry run of prune_rate_buckets ($1 idle seconds)
SELECT count(*) FROM rate_buckets WHERE tat < now() - make_interval(secs => $1);

-- name: compact_tallies
-- Fold the dead and failed tallies' +1/-1 rows into one row per lane, tenant and status (zeros dropped); rows appended meanwhile are not in this statement's snapshot and stay for the next pass (no parameters)
WITH taken AS (
    DELETE FROM job_tallies RETURNING queue, tenant, status, n
)
INSERT INTO job_tallies (queue, tenant, status, n)
SELECT queue, tenant, status, sum(n) FROM taken
GROUP BY queue, tenant, status
HAVING sum(n) <> 0;

-- name: fleet_stats_lock
-- One refresher of the fleet's gauges at a time: try the namespace's stats lock for the rest of this transaction (no parameters)
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.fleet_stats')) AS held;

-- name: fleet_stats_age
-- Seconds since the fleet's gauges were last stored, or null if never (no parameters)
SELECT extract(epoch FROM now() - taken_at)::float8 FROM fleet_stats_taken;

-- name: clear_fleet_stats
-- The first statement of storing the fleet's gauges: forget the stored rows and mark the snapshot taken now (no parameters)
WITH taken AS (
    INSERT INTO fleet_stats_taken (one, taken_at) VALUES (true, now())
    ON CONFLICT (one) DO UPDATE SET taken_at = excluded.taken_at
)
DELETE FROM fleet_stats;

-- name: store_fleet_stats
-- The second: store these rows as the fleet's gauges ($1 queues, $2 tenants, $3 queued, $4 running, $5 retrying, $6 dead, $7 failed, $8 scheduled, $9 oldest waiting seconds, $10 finished)
INSERT INTO fleet_stats (queue, tenant, queued, running, retrying, dead, failed, scheduled,
                         oldest_waiting_seconds, finished)
SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                     $7::int8[], $8::int8[], $9::float8[], $10::int8[]);

-- name: read_fleet_stats
-- The fleet's stored gauges with the snapshot's age in seconds (one row with null lane when it holds none; no row when none was ever stored); a waiting job's age is as of now (no parameters)
SELECT extract(epoch FROM now() - t.taken_at)::float8 AS age, s.queue, s.tenant, s.queued,
       s.running, s.retrying, s.dead, s.failed, s.scheduled,
       CASE WHEN s.queued + s.retrying > 0
            THEN s.oldest_waiting_seconds + extract(epoch FROM now() - t.taken_at)
            ELSE 0 END::float8 AS oldest_waiting_seconds,
       s.finished
FROM fleet_stats_taken AS t
LEFT JOIN fleet_stats AS s ON true
ORDER BY s.queue, s.tenant;

-- name: prune_sessions
-- Delete up to $1 dashboard sessions that expired over a day ago (a revoked one expires too; the day lets a late request still read why it was refused), oldest first by dashboard_sessions_expiry ($1 batch size)
DELETE FROM dashboard_sessions
WHERE token_hash IN (
    SELECT token_hash FROM dashboard_sessions
    WHERE expires_at < now() - interval '1 day'
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
);

-- name: count_prunable_sessions
-- The dry run of prune_sessions (no parameters)
SELECT count(*) FROM dashboard_sessions WHERE expires_at < now() - interval '1 day';

-- name: prune_audit
-- Delete up to $2 audit-log entries older than $1 seconds, oldest first by audit_log_at ($1 retention seconds, $2 batch size)
DELETE FROM audit_log
WHERE id IN (
    SELECT id FROM audit_log
    WHERE at < now() - make_interval(secs => $1)
    ORDER BY at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: count_prunable_audit
-- The dry run of prune_audit ($1 retention seconds)
SELECT count(*) FROM audit_log WHERE at < now() - make_interval(secs => $1);
