-- Pasted inside "repeat ... until true" at the top of the renewals
-- (lock_renew.lua, lock_renew_many.lua, rw_renew.lua): statements, not a
-- function, because creating a closure costs every renewal. Reads key,
-- forced (may be nil) and holder. The holder's own field is all a renewal
-- reads (HGET fails on a key of another type). When it holds nothing,
-- code is WRONG_TYPE, ABSENT, OTHER or FORCED and the loop is left;
-- otherwise v is the count, a string.
v = redis.pcall('hget', key, holder)
if type(v) == 'table' then
    code = -1
    break
end
if not v then
    code = -3
    if redis.call('exists', key) == 0 then
        code = -2
        if forced and redis.call('exists', forced) == 1 then
            code = -4
        end
    end
    break
end
if #v > 15 or not string.find(v, '^[1-9][0-9]*$') then
    code = -1
    break
end
