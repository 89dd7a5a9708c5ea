-- Included by the cache scripts (lua2c.sh pastes it in: Redis scripts
-- cannot share code at run time).
-- An entry leased wrote is a hash with only the fields v (the value),
-- n ("1": a cached "not found") and l (the current fill lease), at least
-- one of them, never v and n together; a lease alone always expires (the
-- entry's TTL is then the lease's). entry_fields returns {v, n, l} of such
-- an entry, or nil for data leased did not write. KEY must be a hash.
local function entry_fields(key)
    local f = redis.call('HMGET', key, 'v', 'n', 'l')
    local k = 0
    for i = 1, 3 do
        if f[i] then
            k = k + 1
        end
    end
    if k == 0 or k ~= redis.call('HLEN', key) or (f[2] and f[2] ~= '1')
       or (f[1] and f[2])
       or (not f[1] and not f[2] and redis.call('PTTL', key) < 0) then
        return nil
    end
    return f
end
