-- cache.set: unconditional write; any outstanding fill lease is void.
-- KEYS[1] entry hash; ARGV[1] "v" or "n", ARGV[2] value, ARGV[3] ttl_ms
-- (already jittered), ARGV[4] channel, ARGV[5] if_version ("" for none):
-- store only when the entry's version is that one (0: no value and no
-- null there).
-- Returns {rc, version}, rc (enum cache_write_rc CACHE_WRITE_ + these
-- names on the C side):
--   DONE 1        set; version is the one it got
--   MOVED 2       the version is not ARGV[5]; version is the current one,
--                 nothing changed
--   WRONG_TYPE -1 data leased did not write, left alone (cache.invalidate
--                 removes it); version 0
--@include cache_shape.lua
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
    return {WRONG_TYPE, 0}
end
local cur = 0
if t == 'hash' then
    local f = entry_fields(KEYS[1])
    if not f then
        return {WRONG_TYPE, 0}
    end
    cur = entry_version(f)
end
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= cur then
    return {MOVED, cur}
end
local ver = next_version(cur)
redis.call('DEL', KEYS[1])
if ARGV[1] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', version_text(ver))
else
    redis.call('HSET', KEYS[1], 'n', '1', 'r', version_text(ver))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], 'set')
return {DONE, ver}
