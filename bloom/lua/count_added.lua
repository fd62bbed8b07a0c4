-- count_added: count items added into the filter's meta, only if the meta is
-- there: a meta lost by Redis must not come back with nothing but a counter
-- (a partial meta would pass for a filter with no layout).
-- KEYS[1]  meta key (a hash)
-- ARGV[1]  items added
-- Returns  the new count, or -1 if the meta is missing or partial.
if redis.call('HEXISTS', KEYS[1], 'format') == 0 then
  return -1
end
return redis.call('HINCRBY', KEYS[1], 'added', ARGV[1])
