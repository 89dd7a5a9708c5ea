-- Included by the read-write lock scripts (lua2c.sh pastes it in), after
-- lib/rw_tkey.lua; the layout: rw_acquire.lua.
-- The shape checks (lib/lock_shape.lua) are created only when a script
-- needs them: their closures would cost every call.
local function rw_shape()
--@include lock_shape.lua
    return is_rwlock
end

-- The read-write lock at KEYS[1] as holder FIELD sees it: the number of
-- its fields (0: no key), its mode and FIELD's count (nil: FIELD holds
-- nothing); false for data that is not a read-write lock. HLEN fails on
-- a key of another type, which saves a TYPE; a hash of the mode and this
-- daemon's own token (32 hex digits) alone is whole in one HMGET, and
-- only other hashes have every field checked.
local function rw_open(field)
    local len = redis.pcall('hlen', KEYS[1])
    if type(len) == 'table' then
        return false
    end
    if len == 0 then
        return 0
    end
    local v = redis.call('hmget', KEYS[1], 'mode', field)
    local hmode, c = v[1], v[2]
    if len == 2 and c and #field == 32
            and string.find(field, '^[0-9a-f]+$') then
        if (hmode ~= 'read' and hmode ~= 'write')
                or not string.find(c, '^[1-9]%d*$') then
            return false
        end
    elseif not rw_shape()(KEYS[1], field, len) then
        return false
    end
    return len, hmode, c
end

-- Whether holder F (C holds) of a read-write lock in mode HMODE is a
-- reader: in write mode the hash holds the writer and the writer's own
-- readers, and only readers have lease keys.
local function rw_is_reader(pfx, hmode, f, c)
    return hmode ~= 'write'
           or redis.call('exists', rw_tkey(pfx, f, c)) == 1
end
