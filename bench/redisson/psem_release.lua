-- RPermitExpirableSemaphore release of one permit id
-- (RedissonPermitExpirableSemaphore tryReleaseAsync(permitId), which
-- releaseAsync(permitId) calls): drop the permit from the lease zset, give
-- it back to the counter and wake the waiters.
-- KEYS[1] permits counter  KEYS[2] channel (redisson_sc:{name})
-- KEYS[3] lease zset ({name}:timeout)
-- ARGV[1] permit id  ARGV[2] permits it stands for (1)  ARGV[3] now (ms)
-- ARGV[4] publish command (publish or spublish)
-- Answers 1 when a live permit was released; 0 when the id was not held,
-- or was held past its lease (it is given back all the same).
local ends = redis.call('zscore', KEYS[3], ARGV[1])
local gone = redis.call('zrem', KEYS[3], ARGV[1])
if tonumber(gone) ~= 1 then
    return 0
end
local free = redis.call('incrby', KEYS[1], ARGV[2])
redis.call(ARGV[4], KEYS[2], free)
if tonumber(ends) <= tonumber(ARGV[3]) then
    return 0
end
return 1
