-- Placeholder on branch h/ratelimit only: migrations must be numbered without gaps, and
-- this branch's rate limits are 0007 (0005 and 0006 belong to other parts of issue #15).
-- The merge replaces this file with the real 0006.
SELECT 1;
