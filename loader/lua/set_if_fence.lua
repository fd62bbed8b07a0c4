-- set_if_fence: write a cache entry (a value or an empty marker) only if the
-- writer's fence is still the key's newest, so a load that an invalidation
-- overtook, or whose lock expired and passed to another holder, cannot store
-- what it read.
-- KEYS[1]  value key: a hash, one field per schema version
-- KEYS[2]  fence key (same hash tag as the value key)
-- ARGV[1]  the writer's fence, as a decimal string
-- ARGV[2]  the field (the writer's schema version)
-- ARGV[3]  the frame to store
-- ARGV[4]  TTL in milliseconds (of the whole hash: an invalidation deletes
--          every version at once, so a version kept alive by another's write
--          is never staler than it was)
-- Returns  1 if written, 0 if the fence had moved on (or expired).
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return 0
