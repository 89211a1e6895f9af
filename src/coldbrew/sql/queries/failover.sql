-- Failover (issue #14; migration 0019): a promoted standby is a new server start.

-- name: note_server_epoch
-- Record the primary's current timeline if it is new (a promotion), before a connection reads server_started(): a statement does not see its own function's insert (no parameters)
SELECT note_server_epoch();
