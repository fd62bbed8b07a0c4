-- set_if_fence: write a value (or an empty marker) only if the writer's fence
-- is still the key's newest, so a load that an Invalidate overtook, or whose
-- lock expired and passed to another holder, cannot store what it read.
-- KEYS[1]  value key
-- KEYS[2]  fence key (same hash tag as the value key)
-- ARGV[1]  the writer's fence, as a decimal string
-- ARGV[2]  the frame to store
-- ARGV[3]  TTL in milliseconds
-- Returns  1 if written, 0 if the fence had moved on (or expired).
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
