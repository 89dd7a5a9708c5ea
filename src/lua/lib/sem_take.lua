-- The body of sem_acquire.lua and sem_acquire_fields.lua (lua2c.sh
-- pastes it in), which set FIELD_FROM first: the fewest permits a grant
-- writes its field in the permits hash for. A grant without a field holds
-- one permit (sem_held.lua).
--@include sem_shape.lua
-- How many grants (ZCARD fails on a key of another type: no TYPE of the
-- zset); their names are read only when the hash has fields to match.
local n = redis.pcall('zcard', KEYS[1])
if type(n) == 'table' then
    return {-1}
end
local limit = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
-- The hash's type is asked only when something reads it first: grants
-- to count or clear, or an answer (too many permits) given before the
-- HSET below, which fails on a key of another type before anything is
-- written. A grant without a field on an empty semaphore does not touch
-- the hash: another type there is found by the next acquire that counts.
local h
if n > 0 or want > limit then
    h = redis.call('type', KEYS[2]).ok
    if h ~= 'none' and h ~= 'hash' then
        return {-1}
    end
end
local now = redis_ms()
local held, last = 0, now + lease
if n > 0 then
    -- Numbers go to Redis as '%d' text: a Lua number would be printed
    -- with '%.17g' (about 3k instructions each).
    local nows = string.format('%d', now)
    local live
    if h == 'none' then
        -- No fields (layout 2, grants of one permit each): the dead are
        -- reclaimed and the live counted without a name read, in time
        -- that does not grow with the holders.
        live = n - redis.call('zremrangebyscore', KEYS[1], '-inf', nows)
        held = live
    else
        -- The dead reclaimed, then the live counted, each in one call
        -- (in chunks), not one per grant: a semaphore with many holders
        -- would pay for each on every acquire.
        local all = redis.call('zrange', KEYS[1], '0', '-1')
        local dead = redis.call('zrangebyscore', KEYS[1], '-inf', nows)
        if #dead > 0 then
            for i = 1, #dead, 1000 do
                redis.call('hdel', KEYS[2],
                           unpack(dead, i, math.min(i + 999, #dead)))
            end
            redis.call('zremrangebyscore', KEYS[1], '-inf', nows)
        end
        live = #all - #dead
        if live > 0 then
            -- ZRANGE and ZRANGEBYSCORE list by score alike: the dead
            -- are the first of ALL, and the live the rest.
--@include sem_held.lua
            held = sem_permits(all, #dead + 1)
        end
    end
    if live > 0 then
        if held + want > limit then
            -- How long until the next lease ends: the earliest score.
            local first = redis.call('zrange', KEYS[1], '0', '0', 'withscores')
            local avail = limit - held
            if avail < 0 then
                avail = 0
            end
            return {0, avail, tonumber(first[2]) - now}
        end
        -- The keys live as long as the longest lease: the last score.
        local top = redis.call('zrange', KEYS[1], '-1', '-1', 'withscores')
        if tonumber(top[2]) > last then
            last = tonumber(top[2])
        end
    end
end
if held + want > limit then
    return {0, limit - held > 0 and limit - held or 0, -1}
end
local ttl = string.format('%d', last - now + 1)
if want >= FIELD_FROM then
    -- The permits as sent: a Lua number would be printed back with
    -- sprintf.
    local r = redis.pcall('hset', KEYS[2], ARGV[4], ARGV[2])
    if type(r) == 'table' then
        if string.find(r.err, 'WRONGTYPE', 1, true) then
            return {-1}
        end
        return r
    end
    -- The hash lives as long as the longest lease of a grant with a
    -- field: theirs set it, so a grant without one leaves it be.
    redis.call('pexpire', KEYS[2], ttl)
end
redis.call('zadd', KEYS[1], string.format('%d', now + lease), ARGV[4])
-- The zset lives as long as the longest lease.
redis.call('pexpire', KEYS[1], ttl)
return limit - held - want
