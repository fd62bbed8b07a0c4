-- merge_shard: OR a staging copy into its shard of the next generation, only
-- if both are whole: the shard still exists (so no Add made meanwhile was
-- skipped: set_bits never recreates a shard) and the staging copy holds
-- every bit the rebuild uploaded (no chunk evicted). Then drop the copy.
-- KEYS[1]  shard key of the next generation
-- KEYS[2]  its staging key (same slot)
-- ARGV[1]  the number of bits set in the uploaded copy
-- Returns  1 merged, 0 the shard is gone, -1 the copy lacks bits.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('BITCOUNT', KEYS[2]) ~= tonumber(ARGV[1]) then
  return -1
end
redis.call('BITOP', 'OR', KEYS[1], KEYS[1], KEYS[2])
redis.call('UNLINK', KEYS[2])
return 1
