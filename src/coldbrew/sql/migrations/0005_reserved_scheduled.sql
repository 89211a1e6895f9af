-- PLACEHOLDER, only on branch h/cron: version 0005 belongs to the "scheduled"
-- helper (0005_scheduled.sql). The migration loader refuses gaps, so this empty
-- step stands in for it until the merge; the merger deletes this file.
SELECT 1;
