-- Report a lock: KEYS[1] lock hash, ARGV[1] holder field ("" for none).
-- Returns {-1} the key holds another type or a hash that is not a lock,
-- {0, -2, 0} free, {1, pttl, count of ARGV[1]} held.
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
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {0, -2, 0}
end
if t ~= 'hash' or not is_lock(KEYS[1]) then
    return {-1}
end
local n = 0
if ARGV[1] ~= '' then
    n = tonumber(redis.call('hget', KEYS[1], ARGV[1])) or 0
end
return {1, redis.call('pttl', KEYS[1]), n}
