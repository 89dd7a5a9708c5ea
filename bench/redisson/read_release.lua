-- RReadWriteLock read side, release (RedissonReadLock unlockInnerAsync).
-- KEYS[1] lock hash  KEYS[2] channel  KEYS[3] the holder's timeout key
-- prefix  KEYS[4] the lock's timeout key prefix
-- ARGV[1] message  ARGV[2] holder field
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call('publish', KEYS[2], ARGV[1])
    return 1
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return nil
end
local n = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if n == 0 then
    redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (n + 1))
if redis.call('hlen', KEYS[1]) > 1 then
    local most = -3
    for _, f in ipairs(redis.call('hkeys', KEYS[1])) do
        local c = tonumber(redis.call('hget', KEYS[1], f))
        if type(c) == 'number' then
            for i = c, 1, -1 do
                local t = redis.call('pttl', KEYS[4] .. ':' .. f ..
                                     ':rwlock_timeout:' .. i)
                most = math.max(t, most)
            end
        end
    end
    if most > 0 then
        redis.call('pexpire', KEYS[1], most)
        return 0
    end
    if mode == 'write' then
        return 0
    end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
