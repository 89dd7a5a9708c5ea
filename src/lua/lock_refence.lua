-- Raise a lock's fence counter past the highest fence this daemon handed
-- out for it, then take the next fence. For a plain lock's acquisition
-- sent without that floor (src/lock/ld_lock_acq.c: the argument costs
-- every acquisition) whose fence came back at or below it: the counter
-- went back (FLUSHALL, a restart without persistence, an eviction, a
-- reset to "0"). The lock is held by then; only its fence changes.
-- KEYS[1] fence counter
-- ARGV[1] the floor (a decimal above 0)
-- Returns (src/core/ld_lock_codes.h):
--   {1, 1, "fence", -1}   GRANTED: the new fence, exact; -1 keeps the
--                         lease the acquisition set
--   {-1}                  WRONG_TYPE: the counter is not one leased wrote
--@include lock_numbers.lua
local cur = redis.pcall('get', KEYS[1])
if type(cur) == 'table' or (cur and not valid(cur))
        or not valid(ARGV[1]) then
    return {-1}
end
if not cur or less(cur, ARGV[1]) then
    redis.call('set', KEYS[1], ARGV[1])
end
-- The counter is below 2^63-1 here (valid()), so INCR has a next fence;
-- an error is Redis refusing the write (NOREPLICAS, OOM), raised so that
-- the daemon answers redis_unavailable. The fence is read back as text:
-- INCR's answer would reach Lua as a double.
redis.call('incr', KEYS[1])
return {1, 1, redis.call('get', KEYS[1]), -1}
