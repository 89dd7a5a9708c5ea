--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- Release one hold (unlock) or every hold (session end) of a holder.
-- KEYS[1] lock hash
-- ARGV[1] holder field   ARGV[2] "1" one hold, "a" all holds
-- ARGV[3] unlock channel ARGV[4] unlock message
-- The channel is an argument, not a key: channels have no hash slot.
-- Returns (the codes are named in src/ld_lock_codes.h): {1, 0} RELEASED
-- (and published), {0, count} KEPT: holds remain, {-1} WRONG_TYPE: the
-- key holds another type or a hash that is not a lock, {-2} ABSENT: no
-- lock, {-3} OTHER: held by another.
-- A hash that is not a lock (lib/lock_shape.lua) is never changed.
--@include lock_shape.lua
-- HLEN fails on anything but a hash and is 0 for no key: TYPE is not
-- needed.
local len = redis.pcall('hlen', KEYS[1])
if type(len) == 'table' then
    return {-1}
end
if len == 0 then
    return {-2}
end
local kv = holders(KEYS[1], false, len)
if not kv then
    return {-1}
end
-- The holder's count from the list the shape check read: no HEXISTS, and
-- no HINCRBY for the last hold.
local held = count_of(kv, ARGV[1])
if not held then
    return {-3}
end
if ARGV[2] == '1' and held ~= '1' then
    return {0, redis.call('hincrby', KEYS[1], ARGV[1], -1)}
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[3], ARGV[4])
return {1, 0}
