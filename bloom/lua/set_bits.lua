-- set_bits: set bits in a bitmap shard that exists; never create one.
-- KEYS[1]  shard key
-- ARGV     bit offsets to set to 1
-- Returns  1 if the bits were set, 0 if the shard does not exist.
--
-- A shard that is missing was dropped by a generation switch or lost by Redis;
-- creating it again would allocate up to the offset for a bitmap nobody reads
-- (and whose readiness bit is clear anyway).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
-- BITFIELD takes the offsets in slices: unpack() of more than a few thousand
-- values overflows Lua's C stack.
local slice = 1000
for first = 1, #ARGV, slice do
  local args = {}
  for i = first, math.min(first + slice - 1, #ARGV) do
    args[#args + 1] = 'SET'
    args[#args + 1] = 'u1'
    args[#args + 1] = ARGV[i]
    args[#args + 1] = 1
  end
  redis.call('BITFIELD', KEYS[1], unpack(args))
end
return 1
