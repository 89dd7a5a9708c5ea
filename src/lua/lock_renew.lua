--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- Renew (watchdog), extend, or check a holder's lease. The watchdog sends
-- one of these per lock in a single burst, so the common path is two
-- calls: HGET, PEXPIRE.
-- KEYS[1] lock hash  KEYS[2] force marker (lock_force.lua), optional
-- ARGV[1] holder field
-- ARGV[2] lease in ms; 0 only reports (check only, nothing written)
-- ARGV[3] "1": never shorten the lease (watchdog renewal after an extend)
-- Returns (the codes are named in src/core/ld_lock_codes.h): {1, pttl, count}
-- HELD, {-1} WRONG_TYPE: the key holds another type or a hold count
-- leased did not write, {-2} ABSENT: no lock, {-3} OTHER: held by another
-- holder, {-4} FORCED: no lock, and lock.force_unlock deleted it within
-- the lease it had.
--@include renew_open.lua
local lease = tonumber(ARGV[2])
if lease > 0 then
    -- GT never shortens a lease and saves a PTTL: only a lease longer
    -- than the renewal (after an extend) needs asking for.
    if ARGV[3] ~= '1' then
        redis.call('pexpire', KEYS[1], ARGV[2])
        return {1, lease, tonumber(v)}
    end
    if redis.call('pexpire', KEYS[1], ARGV[2], 'GT') == 1 then
        return {1, lease, tonumber(v)}
    end
end
local left = redis.call('pttl', KEYS[1])
if lease > 0 and left == -1 then
    -- GT leaves a key without a TTL alone: give it the lease.
    redis.call('pexpire', KEYS[1], lease)
    left = lease
end
return {1, left, tonumber(v)}
