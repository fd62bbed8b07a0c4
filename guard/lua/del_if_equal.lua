-- del_if_equal: delete a cached entry only if it still holds the bytes we read,
-- so a corrupt value is removed without racing a fresh write.
-- KEYS[1]  value key
-- ARGV[1]  the bytes read earlier
-- Returns  1 if deleted, 0 if the key held something else or nothing.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
