-- Pasted where a lock script takes a new fence (lock_acquire.lua, a
-- writer in rw_acquire.lua): statements, not a function, because
-- creating a closure costs every call of the script. Reads cur (the
-- counter at KEYS[2], checked by valid()) and floor (ARGV[4]); leaves
-- the new fence, a decimal string, in fence.
if floor ~= '0' and (not cur or less(cur, floor)) then
    -- The counter went back (FLUSHALL, a restart without persistence, an
    -- eviction): carry on from the highest fence handed out here.
    if not valid(floor) then
        return {-1}
    end
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
-- INCR's answer is exact as a Lua number below 2^53; above, the
-- counter's own text.
local fence
if r < 9007199254740992 then
    fence = string.format('%d', r)
else
    fence = redis.call('get', KEYS[2])
end
