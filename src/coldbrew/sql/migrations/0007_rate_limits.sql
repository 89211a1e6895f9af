-- Fleet-wide rate limits (issue #15): a rate and a burst per tenant and per job type,
-- and the GCRA buckets -- one theoretical arrival time per limited key (tenant:x,
-- type:y, key:<type>:<value>), taken with the claim.

ALTER TABLE tenants
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst >= 1);

ALTER TABLE job_types
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst >= 1);

CREATE TABLE rate_buckets (
    key  text PRIMARY KEY,
    tat  timestamptz NOT NULL
);
