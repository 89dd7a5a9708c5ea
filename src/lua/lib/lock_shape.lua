-- Included by the lock scripts that act on a hash named by a request
-- (lua2c.sh pastes it in: Redis scripts cannot share code at run time).
-- A hash is a lock only when every field is a holder (a leased token, or
-- Redisson's <uuid>:<thread id>) with a positive integer count. Anything
-- else is someone else's data: it is reported, never changed.
local function is_lock(key)
    if redis.call('hlen', key) > 64 then
        return false
    end
    local kv = redis.call('hgetall', key)
    for i = 1, #kv, 2 do
        local f = kv[i]
        if not ((#f == 32 and string.match(f, '^[0-9a-f]+$'))
                or string.match(f, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-'
                                   .. '%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x'
                                   .. ':%d+$')) then
            return false
        end
        if not string.match(kv[i + 1], '^[1-9]%d*$') then
            return false
        end
    end
    return true
end
