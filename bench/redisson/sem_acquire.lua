-- RSemaphore tryAcquire (RedissonSemaphore tryAcquireAsync): the permits
-- left are a counter.
-- KEYS[1] permits counter  ARGV[1] permits wanted
local v = redis.call('get', KEYS[1])
if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    return 1
end
return 0
