-- refresh: extend the lock's TTL only if this holder still has it.
-- KEYS[1]  lock key
-- ARGV[1]  token
-- ARGV[2]  new TTL in milliseconds
-- Returns  1 if extended, 0 if the lock had expired or belongs to another.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
