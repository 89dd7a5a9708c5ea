-- Pasted where a lock takes a new fence (lib/lock_fresh.lua, for plain
-- locks and writers): statements, not a function, because creating a
-- closure costs every call of the script. Reads floor (ARGV[3], a
-- decimal: the highest fence this daemon handed out for the lock, "0" for
-- none; nil when the daemon holds the answer against it itself, for a
-- plain lock: lock_refence.lua); leaves INCR's answer, a number, in r.
-- INCR first, its answer held against the floor after: reading the
-- counter before costs every acquisition a GET (about 3.5k Redis
-- instructions), and a counter that went back is rare.
local r = redis.pcall('incr', KEYS[2])
if type(r) == 'table' then
    -- A counter of another type, not a number or at 2^63-1 is foreign
    -- data, left as it was; any other error is Redis refusing the write
    -- (NOREPLICAS, OOM): raised, so that the daemon answers
    -- redis_unavailable.
    if string.find(r.err, 'WRONGTYPE', 1, true) or
            string.find(r.err, 'not an integer', 1, true) or
            string.find(r.err, 'overflow', 1, true) then
        return {-1}
    end
    return r
end
if r < 1 then
    -- The counter was below zero: foreign data, put back as it was.
    redis.call('decr', KEYS[2])
    return {-1}
end
-- r is a double, exact below 2^53; rounding never puts it above a floor
-- it is not above, so only the rounded-equal need the exact decimals.
if floor and floor ~= '0' and r <= tonumber(floor) then
    -- The checks are defined here, where they are needed: creating their
    -- closures would cost every call.
--@include lock_numbers.lua
    local cur = redis.call('get', KEYS[2])
    if not less(floor, cur) then
        -- The counter went back (FLUSHALL, a restart without
        -- persistence, an eviction, a reset to "0"): carry on from the
        -- highest fence handed out here.
        if not valid(floor) then
            return {-1}
        end
        redis.call('set', KEYS[2], floor)
        r = redis.call('incr', KEYS[2])
    end
end
