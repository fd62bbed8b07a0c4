-- abort_rebuild: forget the announced next generation, so that Add stops
-- writing to it, unless another rebuild announced a newer one since.
-- KEYS[1]  meta key
-- ARGV[1]  the next generation this rebuild announced
-- Returns  1 forgotten, 0 the meta names another (or none).
if redis.call('HGET', KEYS[1], 'next') ~= ARGV[1] then
  return 0
end
local f = {'bits', 'hashes', 'shards', 'shard_bits', 'items', 'fp_rate'}
for _, name in ipairs(f) do
  redis.call('HDEL', KEYS[1], 'next_' .. name)
end
redis.call('HDEL', KEYS[1], 'next')
return 1
