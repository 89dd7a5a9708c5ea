-- Included by the cache scripts (lua2c.sh pastes it in: Redis scripts
-- cannot share code at run time).
-- What the writes (cache.fill, cache.release, cache.set) answer: enum
-- cache_write_rc on the C side, CACHE_WRITE_ + these names. MOVED: the
-- entry's version is not the if_version the write was made for.
local DONE, REFUSED, WRONG_TYPE, MOVED = 1, 0, -1, 2

-- An entry leased wrote is a hash with only the fields v (the value),
-- n ("1": a cached "not found"), l (the current fill lease), s (the stale
-- mark: stale-while-revalidate), d (how long the load of the value took,
-- ms: early refresh), g (when the lease l was granted, ms: early
-- refresh) and r (the version of the value or null: versioned writes),
-- at least one of v, n and l, never v and n together; a lease
-- alone always expires (the entry's TTL is then the lease's); s only
-- beside v, holding digits (the wall-clock ms, by Redis' TIME, until
-- which the lease l of the stale entry is honoured; 0 while none was
-- granted); d only beside v and g only beside l, both digits; r only
-- beside v or n, digits (absent in entries written before versions: they
-- read as version 1). Under cache.layout 2 an entry of v or n, r and d
-- alone is a string instead (lib/cache_text.lua); every script reads both.
-- entry_fields returns {v, n, l, s, d, g, r} of such an entry, or nil for
-- data leased did not write. KEY must be a hash. A caller that has read
-- them already passes that HMGET's answer as F and HLEN's as LEN.
local function entry_fields(key, f, len)
    f = f or redis.call('HMGET', key, 'v', 'n', 'l', 's', 'd', 'g', 'r')
    local k = 0
    for i = 1, 7 do
        if f[i] then
            k = k + 1
        end
    end
    if k == 0 or k ~= (len or redis.call('HLEN', key))
       or (f[2] and f[2] ~= '1')
       or (f[1] and f[2])
       or (f[4] and (not f[1] or not string.match(f[4], '^%d+$')))
       or (f[5] and (not f[1] or not string.match(f[5], '^%d+$')))
       or (f[6] and (not f[3] or not string.match(f[6], '^%d+$')))
       or (f[7] and ((not f[1] and not f[2])
                     or not string.match(f[7], '^%d+$')))
       or (not f[1] and not f[2] and not f[3])
       or (not f[1] and not f[2] and redis.call('PTTL', key) < 0) then
        return nil
    end
    return f
end

-- The lease check of a write under a fill lease (cache.fill,
-- cache.release): the fields of the entry at KEY when LEASE is its current
-- lease; else nil and what the write answers: REFUSED when the lease is
-- gone (no entry, or another lease: then the entry's fields too),
-- WRONG_TYPE for data leased did not write. F and LEN as entry_fields
-- takes them, from a caller that read the key (a hash or nothing) already.
local function leased_entry(key, lease, f, len)
    if not f then
        local t = redis.call('TYPE', key)['ok']
        if t == 'none' then
            return nil, REFUSED
        end
        if t ~= 'hash' then
            return nil, WRONG_TYPE
        end
    elseif len == 0 then
        return nil, REFUSED
    end
    f = entry_fields(key, f, len)
    if not f then
        return nil, WRONG_TYPE
    end
    if f[3] ~= lease then
        return nil, REFUSED, f
    end
    return f
end

--@include redis_ms.lua

-- The version of what the entry F (entry_fields) holds: 0 for no value
-- and no null (nothing, or a lease alone), 1 for one written before
-- versions existed.
local function entry_version(f)
    if not f or (not f[1] and not f[2]) then
        return 0
    end
    if not f[7] then
        return 1
    end
    return tonumber(f[7])
end

-- The version a write that stores gives the entry whose version is CUR:
-- above CUR, and no lower than Redis' clock in microseconds, so that a
-- key deleted and written again never gets a version it had before (as
-- long as Redis' clock does not step back over the gap). Microseconds
-- since 1970 are about 2^50.6: far below 2^53, where a Lua number (a
-- double) or a JSON integer would stop being exact, until the year 2255;
-- CUR + 1 can pass the clock only by one per write within a microsecond.
local function next_version(cur)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if cur + 1 > now then
        return cur + 1
    end
    return now
end

-- A version as the digits HSET stores (tostring would write 1.7e+15).
-- '%d', not '%.0f': the float's conversion costs Redis about 2.5k
-- instructions more, and versions are integers far below 2^63.
local function version_text(v)
    return string.format('%d', v)
end
