-- cache.set: unconditional write; any outstanding fill lease is void.
-- KEYS[1] entry hash; ARGV[1] "v" or "n", ARGV[2] value, ARGV[3] ttl_ms
-- (already jittered), ARGV[4] channel.
-- Returns (enum cache_write_rc CACHE_WRITE_ + these names on the C side):
--   DONE 1        set
--   WRONG_TYPE -1 data leased did not write, left alone (cache.invalidate
--                 removes it)
local DONE, WRONG_TYPE = 1, -1
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
    return WRONG_TYPE
end
if t == 'hash' then
    -- Ours: only the fields v, n ("1") and l, at least one, not v and n,
    -- and a lease alone always expires.
    local f = redis.call('HMGET', KEYS[1], 'v', 'n', 'l')
    local k = 0
    for i = 1, 3 do
        if f[i] then
            k = k + 1
        end
    end
    if k == 0 or k ~= redis.call('HLEN', KEYS[1]) or
       (f[2] and f[2] ~= '1') or (f[1] and f[2]) or
       (not f[1] and not f[2] and redis.call('PTTL', KEYS[1]) < 0) then
        return WRONG_TYPE
    end
end
redis.call('DEL', KEYS[1])
if ARGV[1] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[2])
else
    redis.call('HSET', KEYS[1], 'n', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], 'set')
return DONE
