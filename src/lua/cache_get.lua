--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- cache.get: read an entry and, on a miss, maybe grant the fill lease.
-- KEYS[1] entry (a hash, or a string: lib/cache_text.lua); ARGV[1] new
-- lease token, ARGV[2] fill_lease_ms,
-- ARGV[3] "1" to grant a lease on a miss, "0" for a plain read;
-- ARGV[4] "1" with cache.early_refresh (else "0": nothing below about
-- refreshes happens), ARGV[5] its beta, ARGV[6] a uniform number in
-- (0, 1] drawn by the daemon.
-- Fields: v = value, n = cached null, l = the current fill lease. While
-- the entry holds only a lease, its TTL is the lease's, so a vanished
-- loader's lease ends with the key.
-- Returns an array whose first element names the answer (get_replies on
-- the C side, the same names):
--   {'hit', value, version}   a value
--   {'null', version}         a cached "not found"
--   {'held', pttl}   another's lease
--   {'granted'}      ARGV[1] is the lease now; 1, a bare number, when the
--                    key was absent (a table costs Redis about 5k
--                    instructions more)
--   {'miss'}         nothing, no lease asked for
--   {'stale', value, version} a stale value; another caller holds its
--                    lease
--   {'stale_granted', value, version}  a stale value, and ARGV[1] is its
--                    lease now
--   {'refresh', value, version} a value close to its expiry, and ARGV[1]
--                    is the lease to reload it early (XFetch)
-- (version: entry_version, the version of the value or null returned)
--   {'wrong_type'}   data leased did not write, left alone
-- No data in Redis may make this script raise an error.
-- A miss that asks for the lease first, before cache_shape.lua's
-- closures are created (each costs every call).
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
    if ARGV[3] == '1' then
        redis.call('HSET', KEYS[1], 'l', ARGV[1])
        if ARGV[4] == '1' then
            -- The load's length is measured from here to the fill (Redis'
            -- clock in ms, as redis_ms; '%d': a Lua number would be printed
            -- with '%.17g').
            local c = redis.call('TIME')
            local us = c[2] + 0
            redis.call('HSET', KEYS[1], 'g', string.format('%d',
                       c[1] * 1000 + (us - us % 1000) / 1000))
        end
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return 1
    end
    return {'miss'}
end
--@include cache_shape.lua
local early = ARGV[4] == '1'
local f, len
if t == 'hash' then
    f = entry_fields(KEYS[1])
elseif t == 'string' then
    -- A value or a null alone, under cache.layout 2: read here when the
    -- daemon's probe found no hit in it (a reader that may refresh early,
    -- or a daemon under layout 1).
    local s = redis.call('GET', KEYS[1])
--@include cache_text.lua
end
if not f then
    return {'wrong_type'}
end
if f[4] then
    -- Stale (cache.invalidate "stale"): the old value now, and one lease
    -- at a time to reload it; a lease not filled in time is given again.
    if ARGV[3] == '1' then
        local now = redis_ms()
        if not f[3] or now >= tonumber(f[4]) then
            redis.call('HSET', KEYS[1], 'l', ARGV[1], 's',
                       tostring(now + tonumber(ARGV[2])))
            if early then
                redis.call('HSET', KEYS[1], 'g', tostring(now))
            elseif f[6] then
                redis.call('HDEL', KEYS[1], 'g')
            end
            return {'stale_granted', f[1], entry_version(f)}
        end
    end
    return {'stale', f[1], entry_version(f)}
end
if f[1] then
    -- XFetch: refresh with probability exp(-ttl_left / (d * beta)), so
    -- that one reader reloads before the entry expires. Only entries whose
    -- load time is known (filled under a lease), one lease at a time: a
    -- refresh lease not filled within fill_lease_ms is given again.
    if early and ARGV[3] == '1' and f[5] then
        local now = redis_ms()
        if not f[3] or not f[6]
           or now >= tonumber(f[6]) + tonumber(ARGV[2]) then
            local ttl = redis.call('PTTL', KEYS[1])
            local x = -tonumber(f[5]) * tonumber(ARGV[5])
                      * math.log(tonumber(ARGV[6]))
            if ttl >= 0 and x >= ttl then
                if t == 'string' then
--@include cache_to_hash.lua
                end
                redis.call('HSET', KEYS[1], 'l', ARGV[1], 'g', tostring(now))
                return {'refresh', f[1], entry_version(f)}
            end
        end
    end
    return {'hit', f[1], entry_version(f)}
end
if f[2] then
    return {'null', entry_version(f)}
end
-- A lease alone: entry_fields saw it expire, so PTTL is its time left.
return {'held', redis.call('PTTL', KEYS[1])}
