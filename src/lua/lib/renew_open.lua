-- Pasted at the top of the renewal scripts (lock_renew.lua,
-- rw_renew.lua): statements, not a function, because creating a closure
-- costs every renewal. The holder's own field is all a renewal reads
-- (HGET fails on a key of another type); when it holds nothing the
-- answer is ABSENT, OTHER or FORCED. Leaves the count, a string, in v.
local v = redis.pcall('hget', KEYS[1], ARGV[1])
if type(v) == 'table' then
    return {-1}
end
if not v then
    if redis.call('exists', KEYS[1]) == 0 then
        if KEYS[2] and redis.call('exists', KEYS[2]) == 1 then
            return {-4}
        end
        return {-2}
    end
    return {-3}
end
if #v > 15 or not string.find(v, '^[1-9][0-9]*$') then
    return {-1}
end
