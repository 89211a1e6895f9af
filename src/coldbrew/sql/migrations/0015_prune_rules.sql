-- Retention (0013) meets batches (0011): job_prunable keeps a batch member while its batch
-- is open (pending > 0). A group's callback reads its members' results when the last one
-- ends (batch_fire), and a batch's progress is the mean of its members': a member pruned
-- before then would vanish from both. Once the batch is done its members age out like any
-- job. Still a SQL function PostgreSQL inlines into the prune statements (EXPLAIN: the
-- jobs_finished range scan stays, the batch probe is a primary-key lookup per member).
CREATE OR REPLACE FUNCTION job_prunable(j jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.status IN ('succeeded', 'failed', 'dead', 'cancelled')
           AND j.finished_at IS NOT NULL
           AND j.publish_after IS NULL
           AND (j.batch_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM batches AS b
                               WHERE b.id = j.batch_id AND b.pending > 0))
$$;
