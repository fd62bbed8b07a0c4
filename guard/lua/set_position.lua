-- set_position: advance a change feed's position, unless the key holds less
-- than the caller last saw (Redis lost writes: a restart from an older dump,
-- a failover to a lagging replica, a flush) or more than the new value; so
-- a position Redis lost is never written over. Positions are decimal
-- strings of unsigned 64-bit numbers, compared as such (no Lua number: they
-- may exceed 2^53).
-- KEYS[1]  the feed's position key
-- ARGV[1]  the value the caller last saw ("": absent)
-- ARGV[2]  the new value
-- Returns  "" once set, or the value found instead (" " for absent).
local function less(a, b)
  return #a < #b or (#a == #b and a < b)
end
local cur = redis.call('GET', KEYS[1])
if (cur == false and ARGV[1] ~= '') or (cur and (less(cur, ARGV[1]) or less(ARGV[2], cur))) then
  return cur or ' '
end
redis.call('SET', KEYS[1], ARGV[2])
return ''
