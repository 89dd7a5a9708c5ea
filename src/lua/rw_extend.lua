-- Set the lease of one side of a read-write lock (the extend op; the
-- layout: rw_acquire.lua). The hash then lives as long as the longest
-- lease in it.
-- KEYS[1] lock hash   ARGV[1] holder field   ARGV[2] lease in ms
-- ARGV[3] "read" or "write"   ARGV[4] prefix of the readers' lease keys
-- Returns what lock_extend.lua returns: {1, pttl, count} HELD,
-- {-1} WRONG_TYPE, {-2} ABSENT, {-3} OTHER.
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {-2}
end
if t ~= 'hash' or not is_rwlock(KEYS[1], ARGV[1]) then
    return {-1}
end
local field, mode, pfx = ARGV[1], ARGV[3], ARGV[4]
local hmode = redis.call('hget', KEYS[1], 'mode')
local n = tonumber(redis.call('hget', KEYS[1], field))
if not n or (mode == 'write' and hmode ~= 'write')
        or (mode == 'read' and not rw_is_reader(pfx, hmode, field, n)) then
    return {-3}
end
local lease = tonumber(ARGV[2])
local want = lease
if mode == 'read' then
    for i = n, math.max(1, n - 63), -1 do
        redis.call('set', rw_tkey(pfx, field, i), 1, 'px', lease)
    end
    if hmode == 'write' then
        -- The writer's lease is the hash's: never shortened by its reader.
        want = math.max(lease, redis.call('pttl', KEYS[1]))
    end
end
want = math.max(want, rw_readers_max(KEYS[1], pfx))
redis.call('pexpire', KEYS[1], want)
return {1, lease, n}
