-- replace: after a write to the source of truth, make an entry the only one of
-- an ID, for every schema version: the new value (Set), or an empty marker
-- (Delete). Deleting the load lock voids every load in flight (the holder's
-- write checks its token in the lock), so no slower load that read older data
-- can overwrite it.
-- KEYS[1]  value key (a hash, one field per schema version)
-- KEYS[2]  load lock key (same hash tag)
-- ARGV[1]  the writer's field (its schema version)
-- ARGV[2]  the frame (a value, or the empty marker)
-- ARGV[3]  TTL in milliseconds
-- Returns  1.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
