-- Paused lanes (issue #17; migration 0016): a lane's fleet-wide state. A lane without a
-- row is active; the workers hold a paused lane's deliveries unclaimed.

-- name: list_lanes
-- Every lane with a recorded state, and every lane a worker registered a type on or a job is waiting in, active unless its row says paused (no parameters)
SELECT name, coalesce(bool_or(paused), false) AS paused, max(changed_at) AS changed_at
FROM (
    SELECT name, paused, changed_at FROM lanes
    UNION ALL
    SELECT DISTINCT queue, false, NULL::timestamptz FROM registered_types
    UNION ALL
    SELECT DISTINCT queue, false, NULL::timestamptz FROM tenant_queues
) AS known
GROUP BY name
ORDER BY name;

-- name: set_lane_paused
-- Pause or resume a lane fleet-wide ($1 lane, $2 paused)
INSERT INTO lanes (name, paused) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET paused = $2, changed_at = now()
RETURNING name, paused, changed_at;
