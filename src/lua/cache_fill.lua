--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- cache.fill: store a loaded value, only under the lease that is current.
-- KEYS[1] entry; ARGV[1] lease, ARGV[2] "v" (value) or "n" (null),
-- ARGV[3] value, ARGV[4] ttl_ms (already jittered), ARGV[5] channel,
-- ARGV[6] if_version ("" for none): store only when the entry's version
-- is that one (0: no value and no null there); ARGV[7] cache.layout: "2"
-- stores the entry as a string (lib/cache_text.lua), anything else as a
-- hash.
-- Returns {rc, version}, rc (enum cache_write_rc CACHE_WRITE_ + these
-- names on the C side), or a bare number:
--   version       DONE, stored with that version, as a bare number (a
--                 table costs Redis about 5k instructions more): a
--                 version is never 0 to 2 (next_version)
--   DONE 1        stored; version is the one it got
--   REFUSED 0     the lease is gone: expired, released, invalidated or
--                 overwritten by cache.set; version is the current one
--   MOVED 2       the version is not ARGV[6]; version is the current one
--   WRONG_TYPE -1 data leased did not write, left alone; version 0
-- The common case first, before cache_shape.lua's closures are created
-- (each costs every call): the entry is this lease alone, as the miss
-- left it (the fields: lib/cache_read.lua). A lease alone always expires
-- (PTTL).
local text_first = false
--@include cache_read.lua
local kind, value, ttl = ARGV[2], ARGV[3], ARGV[4]
if len == 1 and f[3] == ARGV[1] and redis.call('PTTL', KEYS[1]) >= 0 then
    if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= 0 then
        return {2, 0}
    end
    -- next_version of 0, inline; sent as '%d' text (a Lua number would
    -- be printed with '%.17g').
    local t = redis.call('TIME')
    local ver = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if ARGV[7] == '2' then
        local ver, d = string.format('%d', ver), ''
--@include cache_put_text.lua
    else
        if kind == 'v' then
            redis.call('HSET', KEYS[1], 'v', value, 'r',
                       string.format('%d', ver))
        else
            redis.call('HSET', KEYS[1], 'n', '1', 'r',
                       string.format('%d', ver))
        end
        redis.call('HDEL', KEYS[1], 'l')
        redis.call('PEXPIRE', KEYS[1], ttl)
    end
    redis.call('PUBLISH', ARGV[5], 'fill')
    return ver
end
--@include cache_shape.lua
local rc, other
f, rc, other = leased_entry(KEYS[1], ARGV[1], f, len)
if not f then
    return {rc, entry_version(other)}
end
local cur = entry_version(f)
if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= cur then
    return {MOVED, cur}
end
-- "Not found" must never replace a real value (a stale one is replaced).
if ARGV[2] ~= 'v' and f[1] and not f[4] then
    return {REFUSED, cur}
end
local ver = version_text(next_version(cur))
-- Early refresh: how long this value's load took, lease grant to fill
-- ('' for none).
local d = ''
if kind == 'v' and f[6] then
    local x = redis_ms() - tonumber(f[6])
    d = tostring(x > 0 and x or 0)
end
if ARGV[7] == '2' then
--@include cache_put_text.lua
    redis.call('PUBLISH', ARGV[5], 'fill')
    return tonumber(ver)
end
if f[4] then
    -- The reload of a stale entry replaces it, "not found" included.
    redis.call('HDEL', KEYS[1], 'v', 's')
    if f[5] then
        redis.call('HDEL', KEYS[1], 'd')
        f[5] = nil
    end
    f[1] = nil
end
if ARGV[2] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[3], 'r', ver)
    redis.call('HDEL', KEYS[1], 'l', 'n')
    if f[6] then
        redis.call('HSET', KEYS[1], 'd', d)
        redis.call('HDEL', KEYS[1], 'g')
    elseif f[5] then
        redis.call('HDEL', KEYS[1], 'd')
    end
else
    redis.call('HSET', KEYS[1], 'n', '1', 'r', ver)
    redis.call('HDEL', KEYS[1], 'l')
    if f[6] then
        redis.call('HDEL', KEYS[1], 'g')
    end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], 'fill')
return tonumber(ver)
