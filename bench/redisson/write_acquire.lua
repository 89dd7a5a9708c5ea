-- RReadWriteLock write side, acquire (RedissonWriteLock
-- tryLockInnerAsync).
-- KEYS[1] lock hash  ARGV[1] lease ms  ARGV[2] holder field
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'write')
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    local left = redis.call('pttl', KEYS[1])
    redis.call('pexpire', KEYS[1], left + ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
