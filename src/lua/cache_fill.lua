-- cache.fill: store a loaded value, only under the lease that is current.
-- KEYS[1] entry hash; ARGV[1] lease, ARGV[2] "v" (value) or "n" (null),
-- ARGV[3] value, ARGV[4] ttl_ms (already jittered), ARGV[5] channel.
-- Returns 1 stored, 0 refused (lease gone: expired, released, invalidated
-- or overwritten by cache.set), -1 wrong type.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
    return 0
end
if t ~= 'hash' then
    return -1
end
if redis.call('HGET', KEYS[1], 'l') ~= ARGV[1] then
    return 0
end
if ARGV[2] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[3])
    redis.call('HDEL', KEYS[1], 'l', 'n')
else
    -- "Not found" must never replace a real value.
    if redis.call('HEXISTS', KEYS[1], 'v') == 1 then
        return 0
    end
    redis.call('HSET', KEYS[1], 'n', '1')
    redis.call('HDEL', KEYS[1], 'l')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], 'fill')
return 1
