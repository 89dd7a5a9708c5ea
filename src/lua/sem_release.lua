-- Release every permit of one grant and wake the waiters.
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash), left out
-- when the daemon knows the grant wrote no field there (one permit under
-- lock.sem_layout 2): no HGET or HDEL then.
-- ARGV[1] token; the release channel is KEYS[1]..":release" (src/sem/
-- ld_sem.c names it so): made here, it costs Redis less than an argument.
-- Returns the permits, a bare number: RELEASED (and published); {0}
-- ABSENT: the token holds nothing here (never did, released, or its
-- lease ended); {-1} WRONG_TYPE.
--@include sem_shape.lua
-- ZSCORE and HGET fail on a key of another type before anything is
-- written: no TYPE needed.
local score = redis.pcall('zscore', KEYS[1], ARGV[1])
if type(score) == 'table' then
    return {-1}
end
-- A grant without a field holds one permit (sem_held.lua).
local n = 1
if KEYS[2] then
    n = redis.pcall('hget', KEYS[2], ARGV[1])
    if type(n) == 'table' then
        return {-1}
    end
    if n then
        redis.call('hdel', KEYS[2], ARGV[1])
        n = tonumber(n)
    else
        n = 1
    end
end
if score then
    redis.call('zrem', KEYS[1], ARGV[1])
end
if not score or not n or tonumber(score) <= redis_ms() then
    return {0}
end
redis.call('publish', KEYS[1] .. ':release', '1')
return n
