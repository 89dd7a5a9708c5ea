-- Set a holder's lease (the extend op). Unlike the watchdog's renewal it
-- checks that the hash is a lock first: extend names its key and holder
-- from the request, and must never expire someone else's hash.
-- KEYS[1] lock hash   ARGV[1] holder field   ARGV[2] lease in ms
-- Returns (the codes are named in src/core/ld_lock_codes.h): {1, pttl, count}
-- HELD, {-1} WRONG_TYPE: the key holds another type or a hash that is not
-- a lock, {-2} ABSENT: no lock, {-3} OTHER: held by another holder.
-- A hash that is not a lock (lib/lock_shape.lua) is never changed.
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {-2}
end
if t ~= 'hash' or not is_lock(KEYS[1]) then
    return {-1}
end
local v = redis.call('hget', KEYS[1], ARGV[1])
if not v then
    return {-3}
end
local lease = tonumber(ARGV[2])
redis.call('pexpire', KEYS[1], lease)
return {1, lease, tonumber(v)}
