-- cache.fill: store a loaded value, only under the lease that is current.
-- KEYS[1] entry hash; ARGV[1] lease, ARGV[2] "v" (value) or "n" (null),
-- ARGV[3] value, ARGV[4] ttl_ms (already jittered), ARGV[5] channel.
-- Returns (enum cache_write_rc CACHE_WRITE_ + these names on the C side):
--   DONE 1        stored
--   REFUSED 0     the lease is gone: expired, released, invalidated or
--                 overwritten by cache.set
--   WRONG_TYPE -1 data leased did not write, left alone
local DONE, REFUSED, WRONG_TYPE = 1, 0, -1
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
    return REFUSED
end
if t ~= 'hash' then
    return WRONG_TYPE
end
-- Ours: only the fields v, n ("1") and l, at least one, not v and n,
-- and a lease alone always expires.
local f = redis.call('HMGET', KEYS[1], 'v', 'n', 'l')
local k = 0
for i = 1, 3 do
    if f[i] then
        k = k + 1
    end
end
if k == 0 or k ~= redis.call('HLEN', KEYS[1]) or (f[2] and f[2] ~= '1')
   or (f[1] and f[2])
   or (not f[1] and not f[2] and redis.call('PTTL', KEYS[1]) < 0) then
    return WRONG_TYPE
end
if f[3] ~= ARGV[1] then
    return REFUSED
end
if ARGV[2] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[3])
    redis.call('HDEL', KEYS[1], 'l', 'n')
else
    -- "Not found" must never replace a real value.
    if f[1] then
        return REFUSED
    end
    redis.call('HSET', KEYS[1], 'n', '1')
    redis.call('HDEL', KEYS[1], 'l')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], 'fill')
return DONE
