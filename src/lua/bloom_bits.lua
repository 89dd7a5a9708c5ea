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
-- The common case first, before bloom_shape.lua's closure is created (it
-- costs every call): the parameters are the daemon's, in the very text
-- bloom.create wrote from its arguments, so the bits are read or set at
-- once; BITFIELD fails on a bitmap of another type, so no TYPE either.
local p = redis.pcall('HMGET', KEYS[2], 'm', 'k', 'scheme')
if p.err or p[1] ~= ARGV[2] or p[2] ~= ARGV[3] or p[3] ~= '1' then
--@include bloom_shape.lua
    local m, k = bloom_params()
    if not m then
        return {k}
    end
    -- Canonical decimals on both sides: other text is other numbers.
    return {-3, m, k}
end
local k = tonumber(ARGV[3])
local set = ARGV[1] == 'set'
local npos = #ARGV - 3
local out = {1}
-- BITFIELD in chunks: unpack() of every position at once could pass
-- Lua's limit on a call's arguments (1000 keys of 30 bits). Only the
-- first chunk can fail on the type, before anything is written.
local CHUNK = 512
local bits, nbits = {}, 0
local i = 1
while i <= npos do
    local args, a = {'BITFIELD', KEYS[1]}, 2
    local last = math.min(npos, i + CHUNK - 1)
    for j = i, last do
        if set then
            args[a + 1], args[a + 2], args[a + 3], args[a + 4] =
                'SET', 'u1', ARGV[3 + j], '1'
            a = a + 4
        else
            args[a + 1], args[a + 2], args[a + 3] = 'GET', 'u1', ARGV[3 + j]
            a = a + 3
        end
    end
    local r = redis.pcall(unpack(args))
    if r.err then
        if string.find(r.err, 'WRONGTYPE', 1, true) then
            return {-1}
        end
        return r
    end
    for j = 1, #r do
        nbits = nbits + 1
        bits[nbits] = r[j]
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
