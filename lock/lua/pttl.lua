-- pttl: the lock's remaining TTL, if this holder still has it.
-- KEYS[1]  lock key
-- ARGV[1]  token
-- Returns  the TTL in milliseconds, or -1 if the lock is not held by this token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -1
