--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- Release one hold (unlock) or every hold (session end) of a holder.
-- KEYS[1] lock hash
-- ARGV[1] holder field
-- ARGV[2] "a" all holds; "1" or none: one hold
-- ARGV[3] unlock channel; none: KEYS[1]..":unlock" (leased's layout)
-- ARGV[4] unlock message; none: "0" (Redisson's UNLOCK_MESSAGE)
-- The channel is an argument, not a key: channels have no hash slot. The
-- daemon leaves out the arguments it would send as their defaults: each
-- costs Redis about 1k instructions on every call, more than making the
-- channel's name here.
-- Returns (the codes are named in src/core/ld_lock_codes.h): 1 RELEASED
-- (and published; a bare number costs Redis less than {1, 0}), {0, count}
-- KEPT: holds remain, {-1} WRONG_TYPE: the
-- key holds another type or a hash that is not a lock, {-2} ABSENT: no
-- lock, {-3} OTHER: held by another.
-- A hash that is not a lock (lib/lock_shape.lua) is never changed.
-- The holder's own field first (HGET fails on anything but a hash): a
-- hash whose one field is this holder with a count is a lock, and only a
-- hash with more fields needs every field checked (HGETALL).
local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' then
    return {-1}
end
local len = redis.call('hlen', KEYS[1])
-- The common case passes none of the checks below: the daemon's own
-- token (the daemon sends only holder-shaped tokens, and a Redisson
-- holder is longer than 32), the one field, one hold.
if len ~= 1 or held ~= '1' or #ARGV[1] ~= 32 then
    if len == 0 then
        return {-2}
    end
    -- A 32-hex-digit token is the daemon's own: a holder; others
    -- (Redisson's <uuid>:<thread id>) are checked as the lib does.
    local own = #ARGV[1] == 32 and string.find(ARGV[1], '^[0-9a-f]+$')
    if len > 1 or not held or not own then
        -- The shape checks (lib/lock_shape.lua) are defined only here:
        -- creating their closures would cost every call.
--@include lock_shape.lua
        if not holders(KEYS[1], false, len) then
            return {-1}
        end
        if not held then
            return {-3}
        end
    elseif not string.find(held, '^[1-9]%d*$') then
        return {-1}
    end
    if ARGV[2] ~= 'a' and held ~= '1' then
        return {0, redis.call('hincrby', KEYS[1], ARGV[1], '-1')}
    end
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[3] or KEYS[1] .. ':unlock', ARGV[4] or '0')
return 1
