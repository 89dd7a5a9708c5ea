-- Acquire or reenter one side of a read-write lock. The layout is
-- Redisson's RReadWriteLock: one hash with a field "mode" ("read" or
-- "write") and one field per holder with its hold count; a reader's holds
-- have each a lease key (lib/lock_shape.lua, rw_tkey), the hash lives as
-- long as the longest lease in it.
-- KEYS[1] lock hash   KEYS[2] fence counter (same hash slot, no TTL)
-- ARGV[1] lease in ms; 0 keeps the current lease (reentry by token)
-- ARGV[2] holder field (the token)
-- ARGV[3] "1": reenter only, never take a free lock
-- ARGV[4] the highest fence this daemon handed out for the lock
-- ARGV[5] "read" or "write"   ARGV[6] prefix of the readers' lease keys
-- ARGV[7] the same owner's write holder field ("" for none): a reader
--         it names may join the writer (downgrade)
-- Returns what lock_acquire.lua returns (src/core/ld_lock_codes.h). Only a
-- new write acquisition increments the fence counter; a reader gets the
-- counter as it is (the fence of the last writer, "0" for none).
--@include lock_numbers.lua
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t ~= 'none' and (t ~= 'hash' or not is_rwlock(KEYS[1], ARGV[2])) then
    return {-1}
end
local ft = redis.call('type', KEYS[2]).ok
if ft ~= 'none' and ft ~= 'string' then
    return {-1}
end
local cur = redis.call('get', KEYS[2])
if cur and not valid(cur) then
    return {-1}
end
local floor = ARGV[4]
if floor ~= '0' and not valid(floor) then
    return {-1}
end
local lease = tonumber(ARGV[1])
local field, mode, pfx = ARGV[2], ARGV[5], ARGV[6]
local hmode = false
if t == 'hash' then
    hmode = redis.call('hget', KEYS[1], 'mode')
end

-- The fence a reader gets: never below what this daemon handed out.
local function fence_now()
    local f = cur or '0'
    if less(f, floor) then
        f = floor
    end
    return f
end

-- Make the hash live at least until LEFT from now.
local function keep(left)
    if redis.call('pttl', KEYS[1]) < left then
        redis.call('pexpire', KEYS[1], left)
    end
end

local function read_hold(n, left)
    redis.call('set', rw_tkey(pfx, field, n), 1, 'px', left)
    keep(left)
end

if hmode then
    local held = redis.call('hget', KEYS[1], field)
    if held then
        if not count_ok(held) then
            return {-1}
        end
        if (mode == 'write' and hmode ~= 'write') or (mode == 'read'
                and not rw_is_reader(pfx, hmode, field, tonumber(held))) then
            return {-3, redis.call('pttl', KEYS[1])}
        end
        local n = redis.call('hincrby', KEYS[1], field, 1)
        local left
        if mode == 'read' then
            left = lease
            if left <= 0 then
                left = redis.call('pttl', rw_tkey(pfx, field, n - 1))
            end
            if left <= 0 then
                left = math.max(redis.call('pttl', KEYS[1]), 1)
            end
            read_hold(n, left)
        else
            if lease > 0 then
                keep(lease)
            end
            left = redis.call('pttl', KEYS[1])
        end
        local f = cur
        if not valid(f) then
            f = '0'
        end
        return {1, n, f, left}
    end
end
if ARGV[3] == '1' then
    if not hmode then
        return {-2}
    end
    return {-3, redis.call('pttl', KEYS[1])}
end
if mode == 'read' then
    if hmode == 'write' and not (ARGV[7] ~= ''
            and redis.call('hexists', KEYS[1], ARGV[7]) == 1) then
        return {0, redis.call('pttl', KEYS[1])}
    end
    if not hmode then
        redis.call('hset', KEYS[1], 'mode', 'read')
    end
    redis.call('hset', KEYS[1], field, 1)
    read_hold(1, lease)
    return {1, 1, fence_now(), lease}
end
if hmode then
    return {0, redis.call('pttl', KEYS[1])}
end
if floor ~= '0' and (not cur or less(cur, floor)) then
    -- The counter went back (FLUSHALL, a restart without persistence, an
    -- eviction): carry on from the highest fence handed out here.
    redis.call('set', KEYS[2], floor)
end
local r = redis.pcall('incr', KEYS[2])
if type(r) == 'table' then
    -- A counter of another type or not a number is foreign data; any
    -- other error is Redis refusing the write (NOREPLICAS, OOM): raised,
    -- so that the daemon answers redis_unavailable.
    if string.find(r.err, 'WRONGTYPE', 1, true) or
            string.find(r.err, 'not an integer', 1, true) then
        return {-1}
    end
    return r
end
redis.call('hset', KEYS[1], 'mode', 'write', field, 1)
redis.call('pexpire', KEYS[1], lease)
return {1, 1, redis.call('get', KEYS[2]), lease}
