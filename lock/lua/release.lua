-- release: delete the lock only if this holder still has it.
-- KEYS[1]  lock key
-- ARGV[1]  token
-- Returns  1 if released, 0 if the lock had expired or belongs to another.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
