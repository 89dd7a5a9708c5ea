-- cache.set: unconditional write; any outstanding fill lease is void.
-- KEYS[1] entry hash; ARGV[1] "v" or "n", ARGV[2] value, ARGV[3] ttl_ms
-- (already jittered), ARGV[4] channel.
-- Returns (enum cache_write_rc CACHE_WRITE_ + these names on the C side):
--   DONE 1        set
--   WRONG_TYPE -1 data leased did not write, left alone (cache.invalidate
--                 removes it)
--@include cache_shape.lua
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
    return WRONG_TYPE
end
if t == 'hash' then
    local f = entry_fields(KEYS[1])
    if not f then
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
