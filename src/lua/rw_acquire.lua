-- Acquire or reenter one side of a read-write lock. The layout is
-- Redisson's RReadWriteLock: one hash with a field "mode" ("read" or
-- "write") and one field per holder with its hold count; a reader's holds
-- have each a lease key (lib/rw_tkey.lua), the hash lives as
-- long as the longest lease in it.
-- KEYS[1] lock hash   KEYS[2] fence counter (same hash slot, no TTL)
-- ARGV[1] lease in ms; 0 keeps the current lease (reentry by token)
-- ARGV[2] holder field (the token)
-- ARGV[3] "r": reenter only, never take a free lock; otherwise the
--         highest fence this daemon handed out for the lock
-- ARGV[4] "read" or "write"   ARGV[5] prefix of the readers' lease keys
--         (a reader only: a writer never reads it, nor ARGV[6])
-- ARGV[6] the same owner's write holder field ("" for none): a reader
--         it names may join the writer (downgrade)
-- Returns what lock_acquire.lua returns (src/core/ld_lock_codes.h), a new
-- reader's fence 0 too. Only a new write acquisition increments the fence
-- counter; a reader gets the counter as it is (the fence of the last
-- writer, "0" for none).
local floor = ARGV[3]
local field, mode, pfx = ARGV[2], ARGV[4], ARGV[5]
--@include lock_fresh.lua
--@include rw_tkey.lua
--@include lock_numbers.lua
local reenter = floor == 'r'
if reenter then
    floor = '0'
end
-- The counter is a string or nothing: GET fails on anything else, which
-- saves asking for its type first.
local cur = redis.pcall('get', KEYS[2])
if type(cur) == 'table' or (cur and not valid(cur))
        or (floor ~= '0' and not valid(floor)) then
    return {-1}
end
-- A reader on a free lock, before the closures of lib/rw_open.lua are
-- created: EXISTS, GET, HSET, SET, PEXPIRE.
if mode == 'read' and not reenter
        and redis.call('exists', KEYS[1]) == 0 then
    redis.call('hset', KEYS[1], 'mode', 'read', field, '1')
    -- ARGV[1] as sent: a Lua number would be printed back with sprintf.
    redis.call('set', rw_tkey(pfx, field, '1'), '1', 'px', ARGV[1])
    redis.call('pexpire', KEYS[1], ARGV[1])
--@include rw_reader_fence.lua
end
--@include rw_open.lua
local len, hmode, held = rw_open(field)
if not len then
    return {-1}
end
local lease = tonumber(ARGV[1])

-- Make the hash live at least until LEFT from now.
local function keep(left)
    if redis.call('pttl', KEYS[1]) < left then
        redis.call('pexpire', KEYS[1], left)
    end
end

if held then
    if not count_ok(held) then
        return {-1}
    end
    if (mode == 'write' and hmode ~= 'write') or (mode == 'read'
            and not rw_is_reader(pfx, hmode, field, tonumber(held))) then
        return {-3, redis.call('pttl', KEYS[1])}
    end
    local n = redis.call('hincrby', KEYS[1], field, '1')
    local left
    if mode == 'read' then
        left = lease
        if left <= 0 then
            left = redis.call('pttl', rw_tkey(pfx, field, n - 1))
        end
        if left <= 0 then
            left = math.max(redis.call('pttl', KEYS[1]), 1)
        end
        redis.call('set', rw_tkey(pfx, field, n), '1', 'px', left)
        keep(left)
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
if reenter then
    if not hmode then
        return {-2}
    end
    return {-3, redis.call('pttl', KEYS[1])}
end
if mode == 'read' then
    if hmode == 'write' and not (ARGV[6] ~= ''
            and redis.call('hexists', KEYS[1], ARGV[6]) == 1) then
        return {0, redis.call('pttl', KEYS[1])}
    end
    -- Joining the readers (a free lock was taken above).
    redis.call('hset', KEYS[1], field, '1')
    -- ARGV[1] as sent: a Lua number would be printed back with sprintf.
    redis.call('set', rw_tkey(pfx, field, '1'), '1', 'px', ARGV[1])
    keep(lease)
--@include rw_reader_fence.lua
end
-- A writer: a free lock was taken at the top (lib/lock_fresh.lua).
return {0, redis.call('pttl', KEYS[1])}
