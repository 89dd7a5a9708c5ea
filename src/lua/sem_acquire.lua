-- Take PERMITS of a semaphore of LIMIT permits for one new grant.
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash), one slot
-- ARGV[1] limit   ARGV[2] permits   ARGV[3] lease in ms   ARGV[4] token
-- Grants whose lease ended are reclaimed first, so a dead holder never
-- keeps capacity. Returns:
--   {1, available, lease}  GRANTED (available after this grant)
--   {0, available, wait}   TAKEN: too few permits; WAIT is the time until
--                          the next lease ends (-1: none ends)
--   {-1}                   WRONG_TYPE
--@include sem_shape.lua
if not sem_shape_ok() then
    return {-1}
end
local now = sem_now()
local dead = redis.call('zrangebyscore', KEYS[1], '-inf', now)
for i = 1, #dead do
    redis.call('hdel', KEYS[2], dead[i])
end
if #dead > 0 then
    redis.call('zremrangebyscore', KEYS[1], '-inf', now)
end
local limit = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local held = sem_held(now)
if held + want > limit then
    local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
    local wait = -1
    if #first == 2 then
        wait = tonumber(first[2]) - now
    end
    local avail = limit - held
    if avail < 0 then
        avail = 0
    end
    return {0, avail, wait}
end
redis.call('zadd', KEYS[1], now + lease, ARGV[4])
redis.call('hset', KEYS[2], ARGV[4], want)
-- Both keys live as long as the longest lease.
local last = redis.call('zrange', KEYS[1], -1, -1, 'withscores')
local ttl = tonumber(last[2]) - now + 1
redis.call('pexpire', KEYS[1], ttl)
redis.call('pexpire', KEYS[2], ttl)
return {1, limit - held - want, lease}
