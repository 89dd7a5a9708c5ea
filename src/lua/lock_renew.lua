--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- Renew (watchdog), extend, or check a holder's lease. The common path is
-- two calls: HGET, PEXPIRE. The watchdog's passes send lock_renew_many.lua
-- instead where they can (standalone and Sentinel); this one renews early,
-- checks, and renews on Redlock and in cluster mode.
-- KEYS[1] lock hash  KEYS[2] force marker (lock_force.lua), optional
-- ARGV[1] holder field
-- ARGV[2] lease in ms; 0 only reports (check only, nothing written)
-- ARGV[3] "1": never shorten the lease (watchdog renewal after an extend)
-- Returns (the codes are named in src/core/ld_lock_codes.h): {1, pttl, count}
-- HELD, {-1} WRONG_TYPE: the key holds another type or a hold count
-- leased did not write, {-2} ABSENT: no lock, {-3} OTHER: held by another
-- holder, {-4} FORCED: no lock, and lock.force_unlock deleted it within
-- the lease it had.
local key, forced, holder = KEYS[1], KEYS[2], ARGV[1]
local lease_s, keep = ARGV[2], ARGV[3]
local lease = tonumber(lease_s)
local code, v, left
repeat
--@include renew_open.lua
--@include renew_lease.lua
until true
if code then
    return {code}
end
return {1, left, tonumber(v)}
