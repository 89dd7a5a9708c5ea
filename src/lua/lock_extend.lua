-- Set a holder's lease (the extend op). Unlike the watchdog's renewal it
-- checks that the hash is a lock first: extend names its key and holder
-- from the request, and must never expire someone else's hash.
-- KEYS[1] lock hash   ARGV[1] holder field   ARGV[2] lease in ms
-- Returns {1, pttl, count} held, {-1} the key holds another type or a
-- hash that is not a lock, {-2} no lock, {-3} held by another holder.
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
    return {-2}
end
if t ~= 'hash' or not is_lock(KEYS[1]) then
    return {-1}
end
local v = redis.call('hget', KEYS[1], ARGV[1])
if not v then
    return {-3}
end
local lease = tonumber(ARGV[2])
redis.call('pexpire', KEYS[1], lease)
return {1, lease, tonumber(v)}
