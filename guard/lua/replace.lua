-- replace: after a write to the source of truth, make an entry the only one of
-- an ID: the new value (Set) under the writer's schema version alone, or an
-- empty marker (Delete) under the writer's and every version that had an
-- entry (an ID that does not exist is absent whatever the shape of its type).
-- Deleting the load lock voids every load in flight (the holder's write checks
-- its token in the lock), so no slower load that read older data can
-- overwrite it.
-- KEYS[1]  value key (a hash, one field per schema version)
-- KEYS[2]  load lock key (same hash tag)
-- ARGV[1]  the writer's field, or "" (a Guard not yet bound to a type)
-- ARGV[2]  the frame (a value, or the empty marker)
-- ARGV[3]  TTL in milliseconds
-- ARGV[4]  "1": the frame is the empty marker
-- ARGV[5]  the fill-time field: set to Redis's clock (microseconds), as the
--          holder's write sets it (coord's write_release.lua)
-- Returns  1.
local fields = {}
if ARGV[4] == '1' then
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if f ~= ARGV[5] then
      table.insert(fields, f)
    end
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
if ARGV[1] ~= '' then
  table.insert(fields, ARGV[1])
end
if #fields > 0 then
  local t = redis.call('TIME')
  local set = {ARGV[5], t[1] .. string.format('%06d', tonumber(t[2]))}
  for _, f in ipairs(fields) do
    table.insert(set, f)
    table.insert(set, ARGV[2])
  end
  redis.call('HSET', KEYS[1], unpack(set))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
