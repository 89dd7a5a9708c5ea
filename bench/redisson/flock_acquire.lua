-- RFencedLock acquire (RedissonFencedLock tryLockInnerAsync): take a free
-- lock or reenter one's own with a new token from a counter beside the
-- lock; otherwise answer the holder's PTTL. Its release is RLock's
-- (lock_release.lua).
-- KEYS[1] lock hash  KEYS[2] token counter (redisson_lock_token:{name})
-- ARGV[1] lease ms  ARGV[2] holder field
-- Answers {-1, token} when taken, {pttl, -1} when not.
if redis.call('exists', KEYS[1]) == 0
        or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local token = redis.call('incr', KEYS[2])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
