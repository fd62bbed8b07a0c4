-- write_release: the holder's last step, in one round trip. Write the entry
-- (a value or an empty marker) only if the holder's fence is still the
-- key's newest, so a load that a write to the source of truth overtook (its
-- fence deleted), or whose lock expired and passed to another holder, cannot
-- store what it read; then release the lock if this holder still has it, and
-- PUBLISH the value key if a flight in some process waits for it (it left
-- the waiting mark), so that the waiters read what was left.
-- KEYS[1]  value key: a hash, one field per schema version
-- KEYS[2]  fence key (same hash tag as the value key)
-- KEYS[3]  lock key (same hash tag)
-- KEYS[4]  waiting mark (same hash tag)
-- ARGV[1]  the holder's fence, as a decimal string
-- ARGV[2]  the field (the holder's schema version)
-- ARGV[3]  the frame to store
-- ARGV[4]  TTL in milliseconds (of the whole hash: every write to the source
--          of truth deletes every version at once, so a version kept alive by
--          another's write is never staler than it was)
-- ARGV[5]  the holder's lock token
-- ARGV[6]  channel
-- Returns  1 if written, 0 if the fence had moved on (or expired).
--
-- Every obtain of the lock sets the fence key, so a fence that is still the
-- holder's means nobody obtained the lock since: it is the holder's, or it
-- expired. The lock is then deleted without reading it; only a holder whose
-- fence moved on must check that the lock is still its own.
local written = 0
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('DEL', KEYS[3])
  written = 1
elseif redis.call('GET', KEYS[3]) == ARGV[5] then
  redis.call('DEL', KEYS[3])
end
if redis.call('DEL', KEYS[4]) == 1 then
  redis.call('PUBLISH', ARGV[6], KEYS[1])
end
return written
