-- Acquire or reenter a lock (Redisson's hash layout: one field per holder,
-- the hold count as its value, PEXPIRE for the lease).
-- KEYS[1] lock hash   KEYS[2] fence counter (same hash slot, no TTL)
-- ARGV[1] lease in ms; 0 keeps the current lease (reentry by token)
-- ARGV[2] holder field (the token)
-- ARGV[3] "1": reenter only, never take a free lock (reentry by token)
-- Returns {1, count, fence, pttl} granted (count 1 = new acquisition),
-- {0, pttl} held by another holder, {-1} a key holds another type,
-- {-2} reenter-only and no lock, {-3, pttl} reenter-only and held by
-- another holder.
local t = redis.call('type', KEYS[1]).ok
if t ~= 'none' and t ~= 'hash' then
    return {-1}
end
local ft = redis.call('type', KEYS[2]).ok
if ft ~= 'none' and ft ~= 'string' then
    return {-1}
end
local lease = tonumber(ARGV[1])
if t == 'hash' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if lease > 0 then
        redis.call('pexpire', KEYS[1], lease)
    end
    -- Every new acquisition increments the counter, so while this holder
    -- kept the lock the counter still carries its fence.
    local f = tonumber(redis.call('get', KEYS[2])) or 0
    return {1, n, f, redis.call('pttl', KEYS[1])}
end
if ARGV[3] == '1' then
    if t == 'none' then
        return {-2}
    end
    return {-3, redis.call('pttl', KEYS[1])}
end
if t == 'hash' then
    return {0, redis.call('pttl', KEYS[1])}
end
-- Increment first: a counter that is not an integer fails here, before
-- anything was written, so the caller sees wrong_type and nothing changed.
local f = redis.pcall('incr', KEYS[2])
if type(f) == 'table' then
    return {-1}
end
redis.call('hset', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], lease)
return {1, 1, f, lease}
