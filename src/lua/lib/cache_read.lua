-- Pasted at the top of cache_set.lua, cache_fill.lua and cache_release.lua,
-- before any closure is created (each costs every call): the entry's
-- fields as entry_fields reads them, in f, and HLEN's answer, in len, for
-- the script's common case and then for entry_fields. HMGET fails on a key
-- of another type: WRONG_TYPE, {-1, 0} (the write scripts' answer; the
-- daemon reads it from cache_release too), nothing changed.
local f = redis.pcall('HMGET', KEYS[1], 'v', 'n', 'l', 's', 'd', 'g', 'r')
if f.err then
    if string.find(f.err, 'WRONGTYPE', 1, true) then
        return {-1, 0}
    end
    return f
end
local len = redis.call('HLEN', KEYS[1])
