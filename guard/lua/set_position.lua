-- set_position: advance a change feed's position only from the value the
-- caller last saw, so that a position Redis lost (a restart from an older
-- dump, a failover to a lagging replica, a flush) is never written over.
-- KEYS[1]  the feed's position key
-- ARGV[1]  the value the caller expects ("": absent)
-- ARGV[2]  the new value
-- Returns  "" once set, or the value found instead (" " for absent).
local cur = redis.call('GET', KEYS[1])
if (cur or '') ~= ARGV[1] then
  return cur or ' '
end
redis.call('SET', KEYS[1], ARGV[2])
return ''
