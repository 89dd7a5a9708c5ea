-- Pasted where a script must give an entry read as a string (cache.layout
-- 2, lib/cache_text.lua: its fields in f) a lease or a stale mark, which
-- only the hash holds: the same value, version and load time as a hash,
-- with the TTL ttl (PTTL's answer, read before) when there was one. The
-- fill that follows writes the string again.
redis.call('DEL', KEYS[1])
if f[5] then
    redis.call('HSET', KEYS[1], 'v', f[1], 'r', f[7], 'd', f[5])
else
    redis.call('HSET', KEYS[1], 'v', f[1], 'r', f[7])
end
if ttl >= 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
end
