-- create_meta: create a bloom filter's meta hash unless a complete one exists,
-- and return it. A partial meta (no 'format' field: what is left of one that
-- Redis lost, or that an old client recreated with only its counter) counts
-- as missing and is replaced.
-- KEYS[1]  meta key (a hash)
-- ARGV     field1, value1, field2, value2, ... (the caller's configuration)
-- Returns  {created (1 or 0), {field, value, ...}} with the stored fields.
local created = 0
if redis.call('HEXISTS', KEYS[1], 'format') == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(ARGV))
  created = 1
end
return {created, redis.call('HGETALL', KEYS[1])}
