-- Pasted where a lock takes a new fence (lib/lock_fresh.lua, for plain
-- locks and writers): statements, not a function, because creating a
-- closure costs every call of the script. Reads cur (the counter at
-- KEYS[2]: nil, or a string whose first character is a digit 1 to 9;
-- whatever else valid() refuses, INCR refuses below without a change) and
-- floor (ARGV[3], a decimal); leaves INCR's answer, a number, in r.
local back = floor ~= '0' and cur and (#cur < #floor or
                                      (#cur == #floor and cur < floor))
if floor ~= '0' and (not cur or back) then
    -- The counter went back (FLUSHALL, a restart without persistence, an
    -- eviction): carry on from the highest fence handed out here. The
    -- checks are defined here, where they are needed: creating their
    -- closures would cost every call.
--@include lock_numbers.lua
    if not valid(floor) or (cur and not valid(cur)) then
        return {-1}
    end
    redis.call('set', KEYS[2], floor)
end
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
