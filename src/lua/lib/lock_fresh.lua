-- Pasted at the top of lock_acquire.lua and rw_acquire.lua, before any
-- closure is created (each costs every call): a free lock taken anew, the
-- common case, with the fewest calls. EXISTS (a key of any type counts),
-- GET of the counter (GET fails on anything but a string, and INCR
-- refuses what the first character does not), INCR, HSET, PEXPIRE.
-- Reads floor (ARGV[3]: "r" for a reentry only, else the fence floor) and
-- mode ("plain", or the side of a read-write lock: a reader is never
-- taken here). Answers the fence alone (see lock_acquire.lua).
if mode ~= 'read' and floor ~= 'r'
        and redis.call('exists', KEYS[1]) == 0 then
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
