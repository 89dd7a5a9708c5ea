-- Included by the lock scripts that act on a hash named by a request
-- (lua2c.sh pastes it in: Redis scripts cannot share code at run time).
-- A hash is a lock only when every field is a holder (a leased token, or
-- Redisson's <uuid>:<thread id>) with a positive integer count. Anything
-- else is someone else's data: it is reported, never changed.
-- A read-write lock (is_rwlock) is the same, plus a field "mode" of
-- "read" or "write" (Redisson's RReadWriteLock), and its holders may also
-- be Redisson's writers <uuid>:<thread id>:write. The "mode" field is what
-- tells the two kinds apart: a plain lock never has it.
local UUID = '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-'
             .. '%x%x%x%x%x%x%x%x%x%x%x%x:%d+'

local function is_holder(f, rw)
    if #f == 32 and string.match(f, '^[0-9a-f]+$') then
        return true
    end
    if string.match(f, UUID .. '$') then
        return true
    end
    return rw and string.match(f, UUID .. ':write$') ~= nil
end

-- KEY's fields and values (HGETALL's list) when every field is a holder
-- with a count (and, RW, the mode field is there), else false: the
-- scripts that go on look their holder up in the list instead of asking
-- Redis again. LEN is KEY's HLEN when the caller has it.
local function holders(key, rw, len)
    if (len or redis.call('hlen', key)) > (rw and 65 or 64) then
        return false
    end
    local kv = redis.call('hgetall', key)
    local mode = false
    for i = 1, #kv, 2 do
        local f = kv[i]
        if rw and f == 'mode' then
            mode = kv[i + 1] == 'read' or kv[i + 1] == 'write'
            if not mode then
                return false
            end
        elseif not is_holder(f, rw)
               or not string.match(kv[i + 1], '^[1-9]%d*$') then
            return false
        end
    end
    if rw and not mode then
        return false
    end
    return kv
end

local function holders_ok(key, rw)
    return holders(key, rw) ~= false
end

-- The count FIELD holds in the list KV (from holders), nil when none.
local function count_of(kv, field)
    for i = 1, #kv, 2 do
        if kv[i] == field then
            return kv[i + 1]
        end
    end
    return nil
end

local function is_lock(key)
    return holders_ok(key, false)
end

-- Whether KEY (a hash) is a read-write lock that FIELD (nil or "" for
-- none) may act on. Any number of readers share one lock, so only a
-- small hash is checked whole; past that, what the script relies on is
-- looked at (the mode and FIELD's own count), which keeps the work of
-- one script bounded however many readers hold the lock. A lock leased
-- built is never refused for the number of its readers. LEN is KEY's
-- HLEN when the caller has it.
local function is_rwlock(key, field, len)
    len = len or redis.call('hlen', key)
    if len <= 65 then
        return holders(key, true, len) ~= false
    end
    local m = redis.call('hget', key, 'mode')
    if m ~= 'read' and m ~= 'write' then
        return false
    end
    if not field or field == '' then
        return true
    end
    local c = redis.call('hget', key, field)
    return not c or string.match(c, '^[1-9]%d*$') ~= nil
end
