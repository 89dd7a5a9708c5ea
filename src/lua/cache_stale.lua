-- cache.invalidate in stale mode (first and second step): an entry with a
-- value keeps it, marked stale, for at most ARGV[1] ms from now; its fill
-- lease, if any, is void (a load that started before the write must not
-- store). Anything else is dropped as by cache_del. Wakes waiters
-- everywhere either way.
-- KEYS[1] entry; ARGV[1] stale_ms, ARGV[2] channel.
-- Returns 2 when marked stale, else the number of keys removed (0 or 1).
--@include cache_shape.lua
local t = redis.call('TYPE', KEYS[1])['ok']
local f, len = nil, nil
if t == 'hash' then
    f = entry_fields(KEYS[1])
elseif t == 'string' then
    local s = redis.call('GET', KEYS[1])
--@include cache_text.lua
end
if not f or not f[1] then
    local n = redis.call('UNLINK', KEYS[1])
    redis.call('PUBLISH', ARGV[2], 'del')
    return n
end
local ttl = redis.call('PTTL', KEYS[1])
if t == 'string' then
--@include cache_to_hash.lua
else
    redis.call('HDEL', KEYS[1], 'l', 'g')
end
redis.call('HSET', KEYS[1], 's', '0')
if ttl < 0 or ttl > tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[2], 'stale')
return 2
