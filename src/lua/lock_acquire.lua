--@batchable: may run as one item of a batch script (ld_redis_batch.c)
-- Acquire or reenter a lock (Redisson's hash layout: one field per holder,
-- the hold count as its value, PEXPIRE for the lease).
-- KEYS[1] lock hash   KEYS[2] fence counter (same hash slot, no TTL)
-- ARGV[1] lease in ms; 0 keeps the current lease (reentry by token)
-- ARGV[2] holder field (the token)
-- ARGV[3] "r": reenter only, never take a free lock; otherwise the
--         highest fence this daemon handed out for the lock (decimal, "0"
--         for none): a new fence is always above it, even when Redis lost
--         the counter. None: the daemon holds the fence against its own
--         floor (lock_refence.lua), which spares every acquisition an
--         argument and a growth of Lua's ARGV table (about 3k Redis
--         instructions).
-- Returns (the codes are named in src/core/ld_lock_codes.h):
--   fence                      GRANTED, a free lock taken: an integer, the
--                              new fence (below 2^53), count 1 and the
--                              lease ARGV[1]; a bare number costs Redis
--                              less than a table
--   {1, count, "fence", pttl}  GRANTED (count 1 = new acquisition)
--   {0, pttl}                  TAKEN: held by another holder
--   {-1}                       WRONG_TYPE: a key holds another type or data
--                              leased did not write (a hash that is not a
--                              lock: lib/lock_shape.lua)
--   {-2}                       ABSENT: reenter-only and no lock
--   {-3, pttl}                 OTHER: reenter-only and held by another
local floor = ARGV[3]
local mode = 'plain'
--@include lock_fresh.lua
-- Here the key exists, or only a reentry is asked for.
-- Created only past the common case above, as the closures cost every
-- call.
--@include lock_numbers.lua
-- The shape checks (lib/lock_shape.lua) are defined only when a script
-- needs them: creating their closures would cost every call.
local function shape()
--@include lock_shape.lua
    return holders, count_of
end
local t = redis.call('type', KEYS[1]).ok
local kv, count_of = false, nil
if t == 'hash' then
    local holders
    holders, count_of = shape()
    kv = holders(KEYS[1], false)
end
if t ~= 'none' and not kv then
    return {-1}
end
-- The counter is a string or nothing: GET fails on anything else, which
-- saves asking for its type first.
local cur = redis.pcall('get', KEYS[2])
if type(cur) == 'table' then
    return {-1}
end
local lease = tonumber(ARGV[1])
if kv then
    local held = count_of(kv, ARGV[2])
    if held then
        if not count_ok(held) then
            return {-1}
        end
        local n = redis.call('hincrby', KEYS[1], ARGV[2], '1')
        if lease > 0 then
            redis.call('pexpire', KEYS[1], ARGV[1])
        end
        -- Every new acquisition increments the counter, so while this
        -- holder kept the lock the counter still carries its fence.
        if not valid(cur) then
            cur = '0'
        end
        return {1, n, cur, redis.call('pttl', KEYS[1])}
    end
end
if floor == 'r' then
    if t == 'none' then
        return {-2}
    end
    return {-3, redis.call('pttl', KEYS[1])}
end
-- t is 'hash' (anything else was refused above): held by another.
return {0, redis.call('pttl', KEYS[1])}
