-- Pasted at the top of cache_set.lua, cache_fill.lua and cache_release.lua,
-- before any closure is created (each costs every call): the entry's
-- fields as entry_fields reads them, in f, and how many it holds (HLEN's
-- answer), in len, for the script's common case and then for
-- entry_fields; str is true for an entry written as a string
-- (cache.layout 2, lib/cache_text.lua). The includer sets text_first when
-- it expects a string (a write under layout 2 over an entry it wrote):
-- GET is then asked first, else HMGET. A failed HMGET or GET says the key
-- is of the other type; one that is no string of leased's is WRONG_TYPE,
-- {-1, 0} (the write scripts' answer; the daemon reads it from
-- cache_release too), nothing changed.
local f, len, str, s
if text_first then
    s = redis.pcall('GET', KEYS[1])
    if not s then
        f, len = {false, false, false, false, false, false, false}, 0
    elseif s.err then
        s = nil -- a hash, or another type: the HMGET below tells
    end
end
if not f and not s then
    f = redis.pcall('HMGET', KEYS[1], 'v', 'n', 'l', 's', 'd', 'g', 'r')
    if f.err then
        if not string.find(f.err, 'WRONGTYPE', 1, true) then
            return f
        end
        f = nil
        s = redis.pcall('GET', KEYS[1])
    else
        len = redis.call('HLEN', KEYS[1])
    end
end
if not f then
--@include cache_text.lua
    if not f then
        return {-1, 0}
    end
    str = true
end
