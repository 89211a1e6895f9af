-- name: note_retry_trace
-- Before a failed attempt's retrying outcome is written: keep the job's trace context and this attempt's run span (the next attempt's run span links to it) in its row, for the relay's republish; fenced by the attempt ($1 id, $2 attempt, $3 traceparent, $4 tracestate, $5 run span as a traceparent)
UPDATE jobs
SET traceparent = $3, tracestate = $4, trace_previous_span = $5
WHERE id = $1 AND attempt = $2 AND status = 'running';
