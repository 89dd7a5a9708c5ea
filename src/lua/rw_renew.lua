-- Renew (watchdog) or check one side of a read-write lock held by a
-- holder (the layout: rw_acquire.lua).
-- KEYS[1] lock hash  KEYS[2] force marker (lock_force.lua)
-- ARGV[1] holder field
-- ARGV[2] lease in ms; 0 only reports (check only, nothing written)
-- ARGV[3] "1": never shorten the lease (watchdog renewal after an extend)
-- ARGV[4] "read" or "write"   ARGV[5] prefix of the readers' lease keys
-- Returns what lock_renew.lua returns: {1, pttl, count} HELD (pttl: this
-- holder's lease), {-1} WRONG_TYPE, {-2} ABSENT (also: this reader's
-- own lease ran out), {-3} OTHER, {-4} FORCED.
--@include rw_tkey.lua
local key, forced, holder = KEYS[1], KEYS[2], ARGV[1]
local code, v
repeat
--@include renew_open.lua
until true
if code then
    return {code}
end
local n = tonumber(v)
local field, mode, pfx = ARGV[1], ARGV[4], ARGV[5]
local hmode = redis.call('hget', KEYS[1], 'mode')
if hmode ~= 'read' and hmode ~= 'write' then
    return {-1}
end
if mode == 'write' and hmode ~= 'write' then
    return {-3}
end
local tk = KEYS[1]
if mode == 'read' then
    tk = rw_tkey(pfx, field, n)
end
local left = redis.call('pttl', tk)
if mode == 'read' and left == -2 then
    -- A reader's lease ran out although other holders keep the hash (or
    -- the field is the writer's): its hold is over.
    return {-2}
end
local lease = tonumber(ARGV[2])
if lease > 0 and (ARGV[3] ~= '1' or left < lease) then
    if mode == 'read' then
        for i = n, math.max(1, n - 63), -1 do
            redis.call('set', rw_tkey(pfx, field, i), '1', 'px', ARGV[2])
        end
    end
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], ARGV[2])
    end
    left = lease
end
return {1, left, n}
