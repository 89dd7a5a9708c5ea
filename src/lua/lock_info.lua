-- Report a lock: KEYS[1] lock hash, ARGV[1] holder field ("" for none).
-- Returns (the codes are named in src/core/ld_lock_codes.h): {-1} WRONG_TYPE:
-- the key holds another type or a hash that is not a lock, {0, -2, 0}
-- FREE, {1, pttl, count of ARGV[1]} HELD. A query without a side also
-- describes a read-write lock (rw_info.lua): {1, pttl, count, mode}.
-- A hash that is not a lock (lib/lock_shape.lua) is never changed.
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {0, -2, 0}
end
local rw = t == 'hash' and is_rwlock(KEYS[1], ARGV[1])
if t ~= 'hash' or not (rw or is_lock(KEYS[1])) then
    return {-1}
end
local n = 0
if ARGV[1] ~= '' then
    n = tonumber(redis.call('hget', KEYS[1], ARGV[1])) or 0
end
if rw then
    local m = 1
    if redis.call('hget', KEYS[1], 'mode') == 'write' then
        m = 2
    end
    return {1, redis.call('pttl', KEYS[1]), n, m}
end
return {1, redis.call('pttl', KEYS[1]), n}
