-- How many permits of a semaphore of LIMIT are free and held. Reads only.
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash)
-- ARGV[1] limit
-- Returns {1, available, held}, or {-1} WRONG_TYPE.
--@include sem_shape.lua
-- Only this script reads the whole semaphore: the others have their
-- commands refuse a key of another type themselves.
local function sem_shape_ok()
    local z = redis.call('type', KEYS[1]).ok
    local h = redis.call('type', KEYS[2]).ok
    return (z == 'none' or z == 'zset') and (h == 'none' or h == 'hash')
end

--@include sem_held.lua
-- Permits held by grants whose lease has not ended at NOW.
local function sem_held(now)
    return sem_permits(redis.call('zrangebyscore', KEYS[1], '(' .. now,
                                  '+inf'), 1)
end

if not sem_shape_ok() then
    return {-1}
end
local held = sem_held(redis_ms())
local avail = tonumber(ARGV[1]) - held
if avail < 0 then
    avail = 0
end
return {1, avail, held}
