-- cache.set: unconditional write; any outstanding fill lease is void.
-- KEYS[1] entry; ARGV[1] "v" or "n", ARGV[2] value, ARGV[3] ttl_ms
-- (already jittered), ARGV[4] channel, ARGV[5] if_version ("" for none):
-- store only when the entry's version is that one (0: no value and no
-- null there); ARGV[6] cache.layout: "2" stores the entry as a string
-- (lib/cache_text.lua), anything else as a hash.
-- Returns {rc, version}, rc (enum cache_write_rc CACHE_WRITE_ + these
-- names on the C side), or a bare number:
--   MOVED 2       the version is not ARGV[5]; version is the current one,
--                 nothing changed
--   WRONG_TYPE -1 data leased did not write, left alone (cache.invalidate
--                 removes it); version 0
--   version       DONE, as a bare number (a table costs Redis about 5k
--                 instructions more): a version is Redis' clock in
--                 microseconds or above it (next_version), never 0 to 2
-- The common cases come first, before cache_shape.lua's closures are
-- created (each costs every call): no entry, or one holding a value or a
-- null and its version alone (the fields: lib/cache_read.lua).
local text_first = ARGV[6] == '2'
--@include cache_read.lua
local ver, plain
if len == 0 or (len == 2 and f[7] and (f[1] or f[2] == '1') and
                string.find(f[7], '^%d+$')) then
    local cur = len == 0 and 0 or tonumber(f[7])
    if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= cur then
        return {2, cur}
    end
    -- next_version, inline; a number goes to Redis as '%d' text (a Lua
    -- number would be printed with '%.17g').
    local t = redis.call('TIME')
    ver = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if cur + 1 > ver then
        ver = cur + 1
    end
    plain = true
else
--@include cache_shape.lua
    -- Here the key is a hash of another shape: a lease, a stale mark, a
    -- load time beside the value, an entry from before versions, or
    -- foreign data.
    f = entry_fields(KEYS[1], f, len)
    if not f then
        return {WRONG_TYPE, 0}
    end
    local cur = entry_version(f)
    if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= cur then
        return {MOVED, cur}
    end
    ver = next_version(cur)
end
local kind, value, ttl = ARGV[1], ARGV[2], ARGV[3]
if ARGV[6] == '2' then
    local ver, d = string.format('%d', ver), ''
--@include cache_put_text.lua
else
    if str or not plain then
        redis.call('DEL', KEYS[1])
    elseif f[kind == 'v' and 2 or 1] then
        redis.call('HDEL', KEYS[1], kind == 'v' and 'n' or 'v')
    end
    if kind == 'v' then
        redis.call('HSET', KEYS[1], 'v', value, 'r', string.format('%d', ver))
    else
        redis.call('HSET', KEYS[1], 'n', '1', 'r', string.format('%d', ver))
    end
    redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('PUBLISH', ARGV[4], 'set')
return ver
