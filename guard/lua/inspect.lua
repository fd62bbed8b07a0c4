-- inspect: what a Get in another process would find of one ID, with Redis's
-- clock, for the follower's inspector; it writes nothing.
-- KEYS[1]  value key (a hash, one field per schema version)
-- ARGV[1]  the fill-time field
-- ARGV[2]  the empty marker's bytes
-- Returns  {seconds, microseconds (Redis's TIME), the fill time or false,
--          fields holding a value, fields holding the empty marker}.
local t = redis.call('TIME')
local filled, values, markers = false, 0, 0
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  if h[i] == ARGV[1] then
    filled = h[i + 1]
  elseif h[i + 1] == ARGV[2] then
    markers = markers + 1
  else
    values = values + 1
  end
end
return {t[1], t[2], filled, values, markers}
