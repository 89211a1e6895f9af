-- name: capacity_lanes
-- Per lane, over the last $1 seconds, for coldbrew plan: jobs submitted (created) and finished, the first-attempt run times' count, mean, standard deviation and 95th percentile (the service-time sample: retried jobs' started_at is their first start), and the jobs waiting now; a lane appears when any of these is not zero ($1 seconds)
WITH finished AS (
    SELECT queue,
           count(*) AS finished,
           count(*) FILTER (WHERE attempt = 1 AND started_at IS NOT NULL) AS timed,
           (avg(extract(epoch FROM finished_at - started_at))
                FILTER (WHERE attempt = 1 AND started_at IS NOT NULL))::float8
               AS service_mean_seconds,
           (stddev_samp(extract(epoch FROM finished_at - started_at))
                FILTER (WHERE attempt = 1 AND started_at IS NOT NULL))::float8
               AS service_stddev_seconds,
           (percentile_cont(0.95) WITHIN GROUP (
                ORDER BY extract(epoch FROM finished_at - started_at))
                FILTER (WHERE attempt = 1 AND started_at IS NOT NULL))::float8
               AS service_p95_seconds
    FROM jobs
    WHERE finished_at IS NOT NULL
      AND finished_at >= now() - make_interval(secs => $1)
      AND status IN ('succeeded', 'failed', 'cancelled', 'dead')
    GROUP BY queue
), submitted AS (
    SELECT queue, count(*) AS submitted
    FROM jobs
    WHERE created_at >= now() - make_interval(secs => $1)
    GROUP BY queue
), waiting AS (
    SELECT queue, count(*) AS waiting
    FROM jobs
    WHERE status IN ('queued', 'retrying')
    GROUP BY queue
), lanes AS (
    SELECT queue FROM finished UNION SELECT queue FROM submitted UNION SELECT queue FROM waiting
)
SELECT l.queue,
       coalesce(s.submitted, 0)::int AS submitted,
       coalesce(f.finished, 0)::int AS finished,
       coalesce(f.timed, 0)::int AS timed,
       f.service_mean_seconds,
       f.service_stddev_seconds,
       f.service_p95_seconds,
       coalesce(w.waiting, 0)::int AS waiting
FROM lanes AS l
LEFT JOIN finished AS f USING (queue)
LEFT JOIN submitted AS s USING (queue)
LEFT JOIN waiting AS w USING (queue)
ORDER BY l.queue;
