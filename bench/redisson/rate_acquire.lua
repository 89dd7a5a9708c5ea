-- RRateLimiter tryAcquire (RedissonRateLimiter tryAcquireAsync): a
-- sliding-window log. The limiter's hash holds rate, interval (ms), type
-- and keepAliveTime; a counter holds the permits left and a sorted set
-- one member per grant (a packed random id and its permits) scored by
-- the client's clock. A try first gives back the grants older than the
-- interval, then takes from the counter or answers the wait.
-- KEYS[1] limiter hash  KEYS[2] counter  KEYS[3] per-client counter
-- KEYS[4] grants zset   KEYS[5] per-client zset
-- ARGV[1] permits  ARGV[2] now (ms, the client's)  ARGV[3] random id
local rate = redis.call('hget', KEYS[1], 'rate')
local interval = redis.call('hget', KEYS[1], 'interval')
local kind = redis.call('hget', KEYS[1], 'type')
assert(rate and interval and kind, 'not initialized')
local counter, log = KEYS[2], KEYS[4]
if kind == '1' then
    counter, log = KEYS[3], KEYS[5]
end
local want, now = tonumber(ARGV[1]), tonumber(ARGV[2])
assert(tonumber(rate) >= want, 'more permits than the rate')
local left = redis.call('get', counter)
local res = nil
if left then
    local old = redis.call('zrangebyscore', log, 0, now - interval)
    local back = 0
    for _, v in ipairs(old) do
        local _, p = struct.unpack('Bc0I', v)
        back = back + p
    end
    if back > 0 then
        redis.call('zremrangebyscore', log, 0, now - interval)
        if tonumber(left) + back > tonumber(rate) then
            local used = 0
            for _, v in ipairs(redis.call('zrange', log, 0, -1)) do
                local _, p = struct.unpack('Bc0I', v)
                used = used + p
            end
            left = tonumber(rate) - used
        else
            left = tonumber(left) + back
        end
        redis.call('set', counter, left)
    end
    if tonumber(left) < want then
        local first = redis.call('zrange', log, 0, 0, 'withscores')
        res = 3 + interval - (now - tonumber(first[2]))
    else
        redis.call('zadd', log, ARGV[2],
            struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], want))
        redis.call('decrby', counter, want)
    end
else
    redis.call('set', counter, rate)
    redis.call('zadd', log, ARGV[2],
        struct.pack('Bc0I', string.len(ARGV[3]), ARGV[3], want))
    redis.call('decrby', counter, want)
end
local keep = redis.call('hget', KEYS[1], 'keepAliveTime')
if keep and tonumber(keep) > 0 then
    redis.call('pexpire', KEYS[1], keep)
    redis.call('pexpire', counter, keep)
    redis.call('pexpire', log, keep)
else
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', counter, ttl)
        redis.call('pexpire', log, ttl)
    end
end
return res
