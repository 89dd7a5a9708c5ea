-- Release one hold (unlock) or every hold (session end) of one side of a
-- read-write lock (the layout: rw_acquire.lua).
-- KEYS[1] lock hash
-- ARGV[1] holder field   ARGV[2] "read" or "write"
-- ARGV[3] "a": all holds (session end); "1" or none: one hold
-- ARGV[4] unlock channel; none: KEYS[1]..":unlock" (leased's layout)
-- ARGV[5] prefix of the readers' lease keys; none: KEYS[1] (leased's)
-- The daemon leaves out what it would send as the default: each argument
-- costs Redis about 1k instructions on every call, more than making the
-- names here, and Lua's ARGV table grows at 1, 2, 4 and 8 entries.
-- Returns what lock_release.lua returns: 1 RELEASED (this holder
-- holds nothing now; the lock may still be held by other readers),
-- {0, count} KEPT, {-1} WRONG_TYPE, {-2} ABSENT (also: this reader's
-- own lease ran out; its field is cleared), {-3} OTHER.
-- Messages as Redisson's: a reader's last unlock publishes "0"
-- (UNLOCK_MESSAGE, one waiter may go on), a writer's "1"
-- (READ_UNLOCK_MESSAGE, every waiting reader may go on).
--@include rw_tkey.lua
local field, mode, pfx = ARGV[1], ARGV[2], ARGV[5] or KEYS[1]
-- The common case, before the other closures are created (each costs
-- every call): this holder alone, with one hold of its side, the daemon's
-- own token (the daemon sends only holder-shaped tokens, and Redisson's
-- are longer than 32). HLEN fails on a key of another type: the checks
-- below say so.
if #field == 32 and redis.pcall('hlen', KEYS[1]) == 2 then
    local v = redis.call('hmget', KEYS[1], 'mode', field)
    if v[1] == mode and v[2] == '1' then
        -- A reader's own lease may have run out: ABSENT, as below.
        local gone = mode == 'read' and
                     redis.call('del', rw_tkey(pfx, field, '1')) == 0
        redis.call('del', KEYS[1])
        redis.call('publish', ARGV[4] or KEYS[1] .. ':unlock',
                   mode == 'write' and '1' or '0')
        if gone then
            return {-2}
        end
        return 1
    end
end
--@include rw_hold.lua
local held, c, hmode, len = rw_held(field, mode, pfx)
if held ~= 1 then
    return {held}
end
-- A reader whose own lease ran out while others kept the hash holds
-- nothing: its field is cleared and the answer is ABSENT, as for a plain
-- lock whose lease ran out. DEL of its newest lease key tells.
local gone = false
local left = 0
if mode == 'read' then
    gone = redis.call('del', rw_tkey(pfx, field, c)) == 0
end
if ARGV[3] ~= 'a' and not gone then
    left = c - 1
end
if mode == 'read' then
    for i = c - 1, math.max(left + 1, c - 63), -1 do
        redis.call('del', rw_tkey(pfx, field, i))
    end
end
local done = 1
if gone then
    done = {-2}
end
if left > 0 then
    redis.call('hset', KEYS[1], field, left)
    return {0, left}
end
local msg = '0'
if mode == 'write' then
    msg = '1'
end
-- LEN counts the mode and this holder: more is other holders.
if len > 2 then
    redis.call('hdel', KEYS[1], field)
    if mode == 'write' then
        -- The writer's own readers stay (downgrade): now a read lock.
        redis.call('hset', KEYS[1], 'mode', 'read')
    elseif hmode == 'write' then
        return done -- a writer's reader: the writer holds on
    end
    local best = rw_readers_max(KEYS[1], pfx)
    if best > 0 then
        redis.call('pexpire', KEYS[1], best)
        if mode == 'write' then
            redis.call('publish', ARGV[4] or KEYS[1] .. ':unlock', msg)
        end
        return done
    end
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[4] or KEYS[1] .. ':unlock', msg)
return done
