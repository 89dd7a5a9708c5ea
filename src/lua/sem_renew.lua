-- Renew the lease of one grant (watchdog).
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash), left out
-- for a grant that wrote no field there (one permit under
-- lock.sem_layout 2)
-- ARGV[1] token   ARGV[2] lease in ms; 0 only reports (a fixed lease's
-- check: nothing written)
-- Returns {1} HELD (renewed), {0} ABSENT: the grant is gone (released,
-- lease ended, Redis lost it), {-1} WRONG_TYPE.
--@include sem_shape.lua
-- ZSCORE and HEXISTS fail on a key of another type: no TYPE needed (and
-- PEXPIRE, which does not, comes after them).
local score = redis.pcall('zscore', KEYS[1], ARGV[1])
if type(score) == 'table' then
    return {-1}
end
local has = 1
if KEYS[2] then
    has = redis.pcall('hexists', KEYS[2], ARGV[1])
    if type(has) == 'table' then
        return {-1}
    end
end
local now = redis_ms()
if not score or tonumber(score) <= now or has == 0 then
    return {0}
end
local lease = tonumber(ARGV[2])
if lease <= 0 then
    return {1}
end
-- Numbers go to Redis as '%d' text: a Lua number would be printed
-- with '%.17g' (about 3k instructions each).
if tonumber(score) < now + lease then
    redis.call('zadd', KEYS[1], string.format('%d', now + lease), ARGV[1])
end
local last = redis.call('zrange', KEYS[1], '-1', '-1', 'withscores')
local ttl = string.format('%d', tonumber(last[2]) - now + 1)
redis.call('pexpire', KEYS[1], ttl)
if KEYS[2] then
    redis.call('pexpire', KEYS[2], ttl)
end
return {1}
