-- Pasted at the top of lock_acquire.lua and rw_acquire.lua, before any
-- closure is created (each costs every call): a free lock taken anew, the
-- common case, with the fewest calls. EXISTS (a key of any type counts),
-- INCR of the counter, HSET, PEXPIRE.
-- Reads floor (ARGV[3]: "r" for a reentry only, else the fence floor) and
-- mode ("plain", or the side of a read-write lock: a reader is never
-- taken here). Answers the fence alone (see lock_acquire.lua).
if mode ~= 'read' and floor ~= 'r'
        and redis.call('exists', KEYS[1]) == 0 then
    if floor == '0' then
        -- The first fence of the lock this daemon hands out: with no floor
        -- to hold INCR's answer against, the counter is read first. GET
        -- fails on anything but a string, and INCR refuses what the first
        -- character does not, except "0" and below. Past this, the floor
        -- catches a counter that went to "0" or away (lib/fence_incr.lua).
        local cur = redis.pcall('get', KEYS[2])
        if type(cur) == 'table' then
            return {-1}
        end
        if cur then
            local b = string.byte(cur)
            if not b or b < 49 or b > 57 then
                return {-1}
            end
        end
    end
--@include fence_incr.lua
    if mode == 'write' then
        redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], '1')
    else
        redis.call('hset', KEYS[1], ARGV[2], '1')
    end
    -- ARGV[1] as sent: a Lua number would be printed back with sprintf.
    redis.call('pexpire', KEYS[1], ARGV[1])
    if r < 9007199254740992 then
        return r
    end
    return {1, 1, redis.call('get', KEYS[2]), tonumber(ARGV[1])}
end
