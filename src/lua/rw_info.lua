-- Report a read-write lock (the layout: rw_acquire.lua).
-- KEYS[1] lock hash   ARGV[1] holder field ("" for none)
-- ARGV[2] "read" or "write"   ARGV[3] prefix of the readers' lease keys
-- Returns {-1} WRONG_TYPE, {0, -2, 0, 0} FREE, {1, pttl, count of
-- ARGV[1], mode} HELD, where mode is 1 for "read" and 2 for "write".
--@include rw_tkey.lua
--@include rw_open.lua
local len, hmode, c = rw_open(ARGV[1])
if not len then
    return {-1}
end
if len == 0 then
    return {0, -2, 0, 0}
end
local n = 0
if ARGV[1] ~= '' then
    n = tonumber(c) or 0
end
local m = 1
if hmode == 'write' then
    m = 2
end
return {1, redis.call('pttl', KEYS[1]), n, m}
