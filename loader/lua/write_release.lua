-- write_release: the holder's last step, in one round trip. Write the entry
-- (a value or an empty marker) only if the lock still holds this holder's
-- token, so a load that a write to the source of truth overtook (every such
-- write deletes the lock), or whose lock expired and passed to another
-- holder, cannot store what it read; then release the lock, and PUBLISH the
-- value key if a flight in some process waits for it (it left the waiting
-- mark), so that the waiters read what was left.
-- KEYS[1]  value key: a hash, one field per schema version
-- KEYS[2]  lock key (same hash tag as the value key)
-- KEYS[3]  waiting mark (same hash tag)
-- ARGV[1]  the field (the holder's schema version)
-- ARGV[2]  the frame to store
-- ARGV[3]  TTL in milliseconds (of the whole hash: every write to the source
--          of truth deletes every version at once, so a version kept alive by
--          another's write is never staler than it was)
-- ARGV[4]  the holder's lock token
-- ARGV[5]  channel
-- ARGV[6]  the fill-time field: set to Redis's clock (microseconds) with the
--          frame, so an inspector tells an entry filled before a change
--          from one filled after it on Redis's clock alone
-- Returns  0 if the lock was no longer the holder's; if written, 1, or
--          where the hash held other fields (other schema versions, whose
--          entries this holder could not read) an array: 1, then those
--          fields (never the fill-time field). The common write, to a key
--          that is gone, reads no fields.
--
-- The token is the fence: a lock that is still the holder's was neither
-- deleted by a write nor taken by another holder since the holder took it
-- (see loader.Coordinator).
--
-- One DEL takes the lock and the waiting mark together when the write
-- happens: the lock is there (its token was just read), so the mark was
-- there exactly when DEL removed two keys. Every command a script runs costs
-- Redis far more than the same command sent alone.
if redis.call('GET', KEYS[2]) == ARGV[4] then
  local written = 1
  if redis.call('EXISTS', KEYS[1]) == 1 then
    written = {1}
    for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
      if f ~= ARGV[6] then
        table.insert(written, f)
      end
    end
  end
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[6], t[1] .. string.format('%06d', tonumber(t[2])))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  if redis.call('DEL', KEYS[2], KEYS[3]) == 2 then
    redis.call('PUBLISH', ARGV[5], KEYS[1])
  end
  return written
end
if redis.call('DEL', KEYS[3]) == 1 then
  redis.call('PUBLISH', ARGV[5], KEYS[1])
end
return 0
