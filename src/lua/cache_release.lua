-- cache.release: the loader gives its fill lease up without storing.
-- KEYS[1] entry; ARGV[1] lease, ARGV[2] channel.
-- Returns (enum cache_write_rc CACHE_WRITE_ + these names on the C side):
--   DONE 1        released
--   REFUSED 0     the lease was no longer the current one
--   WRONG_TYPE -1 data leased did not write, left alone ({-1, 0} from
--                 lib/cache_read.lua: a key of another type)
-- The common case first, before cache_shape.lua's closures are created
-- (each costs every call): the entry is this lease alone, as the miss
-- left it (see cache_fill.lua).
local text_first = false
--@include cache_read.lua
if len == 1 and f[3] == ARGV[1] and redis.call('PTTL', KEYS[1]) >= 0 then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], 'release')
    return 1
end
--@include cache_shape.lua
local rc
f, rc = leased_entry(KEYS[1], ARGV[1], f, len)
if not f then
    return rc
end
if f[1] or f[2] then
    redis.call('HDEL', KEYS[1], 'l')
    if f[6] then
        redis.call('HDEL', KEYS[1], 'g')
    end
else
    redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[2], 'release')
return DONE
