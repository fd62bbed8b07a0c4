-- del_if_equal: delete a cache entry only if it still holds the bytes we read,
-- so a corrupt value is removed without racing a fresh write.
-- KEYS[1]  value key (a hash, one field per schema version)
-- ARGV[1]  the field
-- ARGV[2]  the bytes read earlier
-- Returns  1 if deleted, 0 if the field held something else or nothing.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
