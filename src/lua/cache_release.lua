-- cache.release: the loader gives its fill lease up without storing.
-- KEYS[1] entry hash; ARGV[1] lease, ARGV[2] channel.
-- Returns (enum cache_write_rc CACHE_WRITE_ + these names on the C side):
--   DONE 1        released
--   REFUSED 0     the lease was no longer the current one
--   WRONG_TYPE -1 data leased did not write, left alone
--@include cache_shape.lua
local f, rc = leased_entry(KEYS[1], ARGV[1])
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
