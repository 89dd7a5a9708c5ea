-- RLock release (RedissonLock unlockInnerAsync): one hold off; the last
-- one deletes the hash and wakes the waiters.
-- KEYS[1] lock hash  KEYS[2] channel
-- ARGV[1] message  ARGV[2] lease ms  ARGV[3] holder field
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
