-- Included by the read-write lock scripts that act on a holder's own
-- hold (rw_release.lua, rw_extend.lua); the acquire and info scripts
-- include lib/rw_open.lua alone, and create none of these closures.
--@include rw_open.lua

-- What a holder's own op (unlock, extend) acts on: 1, FIELD's count, the
-- mode and the number of the hash's fields when FIELD holds side MODE of
-- the lock; else the answer: -1 WRONG_TYPE, -2 ABSENT, -3 OTHER.
local function rw_held(field, mode, pfx)
    local len, hmode, c = rw_open(field)
    if not len then
        return -1
    end
    if len == 0 then
        return -2
    end
    c = tonumber(c)
    if not c or (mode == 'write' and hmode ~= 'write')
            or (mode == 'read' and not rw_is_reader(pfx, hmode, field, c)) then
        return -3
    end
    return 1, c, hmode, len
end

-- The longest lease left among the readers of KEY (-3 when none). Only
-- the 64 most recent holds of a holder are looked at: a bound on the
-- work of one script, and the older ones were set no later.
local function rw_readers_max(key, pfx)
    local best = -3
    local kv = redis.call('hgetall', key)
    for i = 1, #kv, 2 do
        local n = tonumber(kv[i + 1])
        if kv[i] ~= 'mode' and n then
            for j = n, math.max(1, n - 63), -1 do
                local left = redis.call('pttl', rw_tkey(pfx, kv[i], j))
                if left > best then
                    best = left
                end
            end
        end
    end
    return best
end
