-- create_meta: create a bloom filter's meta hash unless it exists, and return it.
-- KEYS[1]  meta key (a hash)
-- ARGV     field1, value1, field2, value2, ... (the caller's configuration)
-- Returns  {created (1 or 0), {field, value, ...}} with the stored fields.
local created = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
  created = 1
end
return {created, redis.call('HGETALL', KEYS[1])}
