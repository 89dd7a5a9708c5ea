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
-- One ZRANGE of every grant (it fails on a key of another type) gives
-- the dead, the live and the longest lease: no TYPE of the zset, no
-- second and third range.
local all = redis.pcall('zrange', KEYS[1], 0, -1, 'withscores')
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
local now = sem_now()
local held, dead, first, last = 0, 0, nil, now + lease
for i = 1, #all, 2 do
    local at = tonumber(all[i + 1])
    if at <= now then
        redis.call('hdel', KEYS[2], all[i])
        dead = dead + 1
    else
        held = held + (tonumber(redis.call('hget', KEYS[2], all[i])) or 0)
        first = first or at
        if at > last then
            last = at
        end
    end
end
if dead > 0 then
    redis.call('zremrangebyscore', KEYS[1], '-inf', now)
end
if held + want > limit then
    local avail = limit - held
    if avail < 0 then
        avail = 0
    end
    return {0, avail, first and first - now or -1}
end
-- The permits as sent: a Lua number would be printed back with sprintf.
local r = redis.pcall('hset', KEYS[2], ARGV[4], ARGV[2])
if type(r) == 'table' then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
        return {-1}
    end
    return r
end
-- Numbers go to Redis as '%d' text: a Lua number would be printed
-- with '%.17g' (about 3k instructions each).
redis.call('zadd', KEYS[1], string.format('%d', now + lease), ARGV[4])
-- Both keys live as long as the longest lease.
local ttl = string.format('%d', last - now + 1)
redis.call('pexpire', KEYS[1], ttl)
redis.call('pexpire', KEYS[2], ttl)
return limit - held - want
