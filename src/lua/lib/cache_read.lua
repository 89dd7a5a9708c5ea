-- Pasted at the top of cache_set.lua, cache_fill.lua and cache_release.lua,
-- before any closure is created (each costs every call): the entry's
-- fields as entry_fields reads them, in f, and how many it holds (HLEN's
-- answer), in len, for the script's common case and then for
-- entry_fields; str is true for an entry written as a string
-- (cache.layout 2, lib/cache_text.lua). HMGET fails on a key of another
-- type; one that is no string of leased's is WRONG_TYPE, {-1, 0} (the
-- write scripts' answer; the daemon reads it from cache_release too),
-- nothing changed.
local f = redis.pcall('HMGET', KEYS[1], 'v', 'n', 'l', 's', 'd', 'g', 'r')
local len, str
if f.err then
    if not string.find(f.err, 'WRONGTYPE', 1, true) then
        return f
    end
    local s = redis.pcall('GET', KEYS[1])
    f = nil
--@include cache_text.lua
    if not f then
        return {-1, 0}
    end
    str = true
else
    len = redis.call('HLEN', KEYS[1])
end
