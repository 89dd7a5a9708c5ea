-- RPermitExpirableSemaphore tryAcquire with a lease
-- (RedissonPermitExpirableSemaphore tryAcquireAsync(ids, timeoutDate)):
-- a counter of free permits beside a sorted set of the permits held, each
-- scored by the time its lease ends. Leases that have ended are swept back
-- into the counter first, then the permits are taken if enough are free.
-- KEYS[1] permits counter  KEYS[2] lease zset ({name}:timeout)
-- KEYS[3] channel (redisson_sc:{name})
-- ARGV[1] permits wanted  ARGV[2] lease end (ms since the epoch)
-- ARGV[3] now (ms)  ARGV[4] the score of a permit without a lease
-- ARGV[5] publish command (publish or spublish)  ARGV[6..] one id a permit
-- Answers 'OK' when granted; when refused, ':' and the earliest lease end
-- if some held permit has a lease (the caller waits that long), else nil.
local ended = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3],
                         'limit', 0, ARGV[1])
if #ended > 0 then
    redis.call('zrem', KEYS[2], unpack(ended))
    local back = redis.call('incrby', KEYS[1], #ended)
    if tonumber(back) > 0 then
        redis.call(ARGV[5], KEYS[3], back)
    end
end
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    for n = 6, #ARGV do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[n])
    end
    -- the lease zset lives as long as the counter does
    local left = redis.call('pttl', KEYS[1])
    if left > 0 then
        redis.call('pexpire', KEYS[2], left)
    end
    return 'OK'
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] ~= nil and first[2] ~= ARGV[4] then
    return ':' .. tostring(first[2])
end
return nil
