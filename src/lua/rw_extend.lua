-- Set the lease of one side of a read-write lock (the extend op; the
-- layout: rw_acquire.lua). The hash then lives as long as the longest
-- lease in it.
-- KEYS[1] lock hash   ARGV[1] holder field   ARGV[2] lease in ms
-- ARGV[3] "read" or "write"   ARGV[4] prefix of the readers' lease keys
-- Returns what lock_extend.lua returns: {1, pttl, count} HELD,
-- {-1} WRONG_TYPE, {-2} ABSENT, {-3} OTHER.
--@include rw_tkey.lua
--@include rw_hold.lua
local field, mode, pfx = ARGV[1], ARGV[3], ARGV[4]
local held, n, hmode = rw_held(field, mode, pfx)
if held ~= 1 then
    return {held}
end
local lease = tonumber(ARGV[2])
local want = lease
if mode == 'read' then
    for i = n, math.max(1, n - 63), -1 do
        redis.call('set', rw_tkey(pfx, field, i), '1', 'px', ARGV[2])
    end
    if hmode == 'write' then
        -- The writer's lease is the hash's: never shortened by its reader.
        want = math.max(lease, redis.call('pttl', KEYS[1]))
    end
end
want = math.max(want, rw_readers_max(KEYS[1], pfx))
redis.call('pexpire', KEYS[1], want)
return {1, lease, n}
