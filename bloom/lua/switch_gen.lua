-- switch_gen: make the next generation current, atomically.
-- KEYS[1]  meta key
-- ARGV[1]  the next generation (must be the one announced)
-- ARGV[2]  items loaded by the rebuild (kept as 'loaded': what the next
--          rebuild's source is compared with)
-- Returns  1, or 0 if that generation is not the announced one.
if redis.call('HGET', KEYS[1], 'next') ~= ARGV[1] then
  return 0
end
local f = {'bits', 'hashes', 'shards', 'shard_bits', 'items', 'fp_rate'}
for _, name in ipairs(f) do
  redis.call('HSET', KEYS[1], name, redis.call('HGET', KEYS[1], 'next_' .. name))
  redis.call('HDEL', KEYS[1], 'next_' .. name)
end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'added', ARGV[2], 'loaded', ARGV[2])
redis.call('HDEL', KEYS[1], 'next')
return 1
