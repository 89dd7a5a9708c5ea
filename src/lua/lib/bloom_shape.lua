-- The parameters of a Bloom filter, as bloom.create wrote them in the
-- hash KEYS[2]: m (bits), k (hashes), capacity, error_rate and scheme
-- (the positions' recipe, "1"). Returns m, k; or nil and -1 (WRONG_TYPE:
-- the hash, or the bitmap KEYS[1], holds data leased did not write) or
-- nil and -2 (NO_FILTER: there is no such filter).
local function bloom_params()
    local p = redis.pcall('HMGET', KEYS[2], 'm', 'k', 'scheme')
    if p.err then
        if string.find(p.err, 'WRONGTYPE', 1, true) then
            return nil, -1
        end
        error(p.err)
    end
    if not p[1] and not p[2] and not p[3] then
        if redis.call('EXISTS', KEYS[2]) == 1 then
            return nil, -1
        end
        return nil, -2
    end
    if not p[1] or not p[2] or p[3] ~= '1' or
        not string.match(p[1], '^[1-9]%d*$') or
        not string.match(p[2], '^[1-9]%d*$') then
        return nil, -1
    end
    local t = redis.call('TYPE', KEYS[1])['ok']
    if t ~= 'none' and t ~= 'string' then
        return nil, -1
    end
    return tonumber(p[1]), tonumber(p[2])
end
