-- bloom.add and bloom.check: set or read the bits of some keys.
-- KEYS[1] the bitmap (a string)   KEYS[2] the parameters (a hash)
-- ARGV[1] "set" or "get"   ARGV[2] m   ARGV[3] k, as the daemon assumed
-- them   ARGV[4..] the bit positions, k per key, key after key
-- Returns:
--   {1, r1, r2, ...}  one per key: "get" 1 when every bit is set (the
--                     key may be in the filter), 0 when one is not (it is
--                     not); "set" 1 when a bit was 0 (the key was surely
--                     not in it before), else 0
--   {-1}              WRONG_TYPE: data leased did not write
--   {-2}              NO_FILTER: no such filter
--   {-3, m, k}        OTHER: the filter has those parameters (it was
--                     made again); nothing was read or changed
--@include bloom_shape.lua
local m, k = bloom_params()
if not m then
    return {k}
end
if m ~= tonumber(ARGV[2]) or k ~= tonumber(ARGV[3]) then
    return {-3, m, k}
end
local set = ARGV[1] == 'set'
local npos = #ARGV - 3
local out = {1}
-- BITFIELD in chunks: unpack() of every position at once could pass
-- Lua's limit on a call's arguments (1000 keys of 30 bits).
local CHUNK = 512
local bits = {}
local i = 1
while i <= npos do
    local args = {'BITFIELD', KEYS[1]}
    local last = math.min(npos, i + CHUNK - 1)
    for j = i, last do
        if set then
            args[#args + 1] = 'SET'
            args[#args + 1] = 'u1'
            args[#args + 1] = ARGV[3 + j]
            args[#args + 1] = '1'
        else
            args[#args + 1] = 'GET'
            args[#args + 1] = 'u1'
            args[#args + 1] = ARGV[3 + j]
        end
    end
    local r = redis.call(unpack(args))
    for j = 1, #r do
        bits[#bits + 1] = r[j]
    end
    i = last + 1
end
for key = 0, npos / k - 1 do
    local all = 1
    for j = 1, k do
        if bits[key * k + j] == 0 then
            all = 0
            break
        end
    end
    if set then
        out[#out + 1] = 1 - all
    else
        out[#out + 1] = all
    end
end
return out
