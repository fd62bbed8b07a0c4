-- clear_markers: after an ID was created, drop its empty markers (of every
-- schema version) and void any load in flight, which may have read "absent"
-- before the create and would write a marker after it: deleting the load
-- lock refuses its write (the holder's write checks its token in the lock).
-- A cached value is never dropped.
-- KEYS[1]  value key (a hash, one field per schema version)
-- KEYS[2]  load lock key (same hash tag)
-- ARGV[1]  the empty marker's bytes
-- Returns  the number of markers dropped.
local dropped = 0
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  if h[i + 1] == ARGV[1] then
    redis.call('HDEL', KEYS[1], h[i])
    dropped = dropped + 1
  end
end
redis.call('DEL', KEYS[2])
return dropped
