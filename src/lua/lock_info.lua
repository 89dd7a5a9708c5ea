-- Report a lock: KEYS[1] lock hash, ARGV[1] holder field ("" for none).
-- Returns (the codes are named in src/ld_lock_codes.h): {-1} WRONG_TYPE:
-- the key holds another type or a hash that is not a lock, {0, -2, 0}
-- FREE, {1, pttl, count of ARGV[1]} HELD.
-- A hash that is not a lock (lib/lock_shape.lua) is never changed.
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {0, -2, 0}
end
if t ~= 'hash' or not is_lock(KEYS[1]) then
    return {-1}
end
local n = 0
if ARGV[1] ~= '' then
    n = tonumber(redis.call('hget', KEYS[1], ARGV[1])) or 0
end
return {1, redis.call('pttl', KEYS[1]), n}
