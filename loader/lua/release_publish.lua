-- release_publish: delete the load lock if this holder still has it, and
-- PUBLISH the value key if a flight in some process waits for it (it left
-- the waiting mark): the waiters re-check what the holder left. Releasing
-- first means a woken waiter that finds no value can take the lock at once.
-- KEYS[1]  lock key
-- KEYS[2]  waiting mark (same hash tag)
-- ARGV[1]  the holder's token
-- ARGV[2]  channel
-- ARGV[3]  message (the value key)
-- Returns  1 if released, 0 if the lock had expired or belongs to another.
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return released
