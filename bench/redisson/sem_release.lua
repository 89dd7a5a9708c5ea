-- RSemaphore release (RedissonSemaphore releaseAsync): give the permits
-- back and wake the waiters.
-- KEYS[1] permits counter  KEYS[2] channel  ARGV[1] permits
local v = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], v)
