-- RReadWriteLock read side, acquire (RedissonReadLock tryLockInnerAsync):
-- the hash carries a "mode" field; each read hold also gets a key of its
-- own with the lease, so that the hash can outlive the shortest reader.
-- KEYS[1] lock hash  KEYS[2] the holder's timeout key prefix
-- ARGV[1] lease ms  ARGV[2] holder field  ARGV[3] writer field
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'read')
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('set', KEYS[2] .. ':1', 1)
    redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if mode == 'read' or (mode == 'write'
        and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    local k = KEYS[2] .. ':' .. n
    redis.call('set', k, 1)
    redis.call('pexpire', k, ARGV[1])
    local left = redis.call('pttl', KEYS[1])
    redis.call('pexpire', KEYS[1], math.max(left, ARGV[1]))
    return nil
end
return redis.call('pttl', KEYS[1])
