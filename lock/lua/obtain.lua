-- obtain: take the lock if it is free and hand out the next fencing number.
-- KEYS[1]  lock key
-- KEYS[2]  fence key (same hash slot as the lock key)
-- ARGV[1]  token (unique, 128 bits: a random per-process prefix and a count)
-- ARGV[2]  lock TTL in milliseconds
-- ARGV[3]  fence key TTL in milliseconds
-- Returns  {1, fence} when obtained (fence as a decimal string),
--          {0, pttl}  when another holder has it (its remaining TTL in ms).
--
-- The fence is max(server time in microseconds, previous fence + 1): it rises
-- with every obtain, and it keeps rising after the fence key expired or was
-- deleted, so the fence key can carry a TTL instead of living forever.
-- Formatted with %.0f: exact below 2^53, where tostring would round it.
if redis.replicate_commands then redis.replicate_commands() end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if prev >= fence then fence = prev + 1 end
fence = string.format('%.0f', fence)
redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
return {1, fence}
