-- Take PERMITS of a semaphore of LIMIT permits for one new grant.
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash), one slot
-- ARGV[1] limit   ARGV[2] permits   ARGV[3] lease in ms   ARGV[4] token
-- Grants whose lease ended are reclaimed first, so a dead holder never
-- keeps capacity. Returns:
--   available              GRANTED: a bare number, the permits available
--                          after this grant, for the lease ARGV[3] (a
--                          table costs Redis about 5k instructions more)
--   {0, available, wait}   TAKEN: too few permits; WAIT is the time until
--                          the next lease ends (-1: none ends)
--   {-1}                   WRONG_TYPE
--@include sem_shape.lua
-- The members alone (ZRANGE fails on a key of another type: no TYPE of
-- the zset): a score in a reply is printed with '%.17g', about 4k
-- instructions each, so scores are asked for only where one is needed.
local all = redis.pcall('zrange', KEYS[1], '0', '-1')
if type(all) ~= 'table' or all.err then
    return {-1}
end
local limit = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
-- The hash's type is asked only when something reads it first: grants
-- to count or clear, or an answer (too many permits) given before the
-- HSET below, which fails on a key of another type before anything is
-- written.
if #all > 0 or want > limit then
    local h = redis.call('type', KEYS[2]).ok
    if h ~= 'none' and h ~= 'hash' then
        return {-1}
    end
end
local now = redis_ms()
local held, last = 0, now + lease
if #all > 0 then
    -- Numbers go to Redis as '%d' text: a Lua number would be printed
    -- with '%.17g' (about 3k instructions each).
    local nows = string.format('%d', now)
    -- The dead reclaimed, then the live counted, each in one call (in
    -- chunks), not one per grant: a semaphore with many holders would
    -- pay for each on every acquire. The permits of ALL are read after
    -- the dead's are deleted: theirs count nothing.
    local dead = redis.call('zrangebyscore', KEYS[1], '-inf', nows)
    if #dead > 0 then
        for i = 1, #dead, 1000 do
            redis.call('hdel', KEYS[2],
                       unpack(dead, i, math.min(i + 999, #dead)))
        end
        redis.call('zremrangebyscore', KEYS[1], '-inf', nows)
    end
    if #all > #dead then
--@include sem_held.lua
        held = sem_permits(all)
        if held + want > limit then
            -- How long until the next lease ends: the earliest score.
            local first = redis.call('zrange', KEYS[1], '0', '0', 'withscores')
            local avail = limit - held
            if avail < 0 then
                avail = 0
            end
            return {0, avail, tonumber(first[2]) - now}
        end
        -- Both keys live as long as the longest lease: the last score.
        local top = redis.call('zrange', KEYS[1], '-1', '-1', 'withscores')
        if tonumber(top[2]) > last then
            last = tonumber(top[2])
        end
    end
end
if held + want > limit then
    return {0, limit - held > 0 and limit - held or 0, -1}
end
-- The permits as sent: a Lua number would be printed back with sprintf.
local r = redis.pcall('hset', KEYS[2], ARGV[4], ARGV[2])
if type(r) == 'table' then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
        return {-1}
    end
    return r
end
redis.call('zadd', KEYS[1], string.format('%d', now + lease), ARGV[4])
-- Both keys live as long as the longest lease.
local ttl = string.format('%d', last - now + 1)
redis.call('pexpire', KEYS[1], ttl)
redis.call('pexpire', KEYS[2], ttl)
return limit - held - want
