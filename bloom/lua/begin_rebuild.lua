-- begin_rebuild: announce the generation being built, so that Add writes to it
-- too from now on. Run with the filter's rebuild lock held.
-- KEYS[1]  meta key
-- ARGV[1]  the current generation the rebuild started from
-- ARGV[2]  the next generation
-- ARGV[3..] next_* field, value pairs (the next generation's layout)
-- Returns  1, or 0 if the current generation is no longer ARGV[1] (or the
--          meta is gone).
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'next', ARGV[2], unpack(ARGV, 3))
return 1
