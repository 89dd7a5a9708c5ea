-- RLock acquire (RedissonLock tryLockInnerAsync): take a free lock or
-- reenter one's own; otherwise answer the holder's PTTL.
-- KEYS[1] lock hash  ARGV[1] lease ms  ARGV[2] holder field
local free = redis.call('exists', KEYS[1]) == 0
if free or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
