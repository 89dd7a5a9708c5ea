-- How many permits of a semaphore of LIMIT are free and held. Reads only.
-- KEYS[1] grant leases (zset)   KEYS[2] grant permits (hash)
-- ARGV[1] limit
-- Returns {1, available, held}, or {-1} WRONG_TYPE.
--@include sem_shape.lua
if not sem_shape_ok() then
    return {-1}
end
local held = sem_held(sem_now())
local avail = tonumber(ARGV[1]) - held
if avail < 0 then
    avail = 0
end
return {1, avail, held}
