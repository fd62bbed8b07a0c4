-- auto_rebuild: may an automatic rebuild of a filter start now, in any
-- process? The back-off is kept here, shared: after a start the next waits
-- ARGV[1] ms, doubling up to ARGV[2] while starts keep coming; a quiet spell
-- of twice the wait (the key expires) starts it over.
-- KEYS[1]  the filter's auto-rebuild key (a hash: until, wait)
-- ARGV[1]  the first wait, in ms
-- ARGV[2]  the longest wait, in ms
-- Returns  the wait after this start in ms, or 0 if one may not start yet.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'until', 'wait')
if h[1] and tonumber(h[1]) > now then
  return 0
end
local wait = tonumber(ARGV[1])
if h[2] then
  wait = math.min(2 * tonumber(h[2]), tonumber(ARGV[2]))
end
redis.call('HSET', KEYS[1], 'until', now + wait, 'wait', wait)
redis.call('PEXPIRE', KEYS[1], 2 * wait)
return wait
