-- OpenTelemetry (issue #17): a job's W3C trace context travels with its row, so that what
-- the relay publishes later (a retry, a scheduled job, a submission whose publish was not
-- confirmed, a reconciled row) stays in the submitter's trace. traceparent/tracestate are
-- written at insert (insert_job) or, for a raw producer's job, by the worker on the retry
-- path; trace_previous_span is the failed attempt's run span, which the next attempt's run
-- span links to. Nullable, no default: adding them rewrites nothing, and rows of untraced
-- jobs stay as they were.
ALTER TABLE jobs
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text,
    ADD COLUMN trace_previous_span text;
