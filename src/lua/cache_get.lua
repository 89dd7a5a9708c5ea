-- cache.get: read an entry and, on a miss, maybe grant the fill lease.
-- KEYS[1] entry hash; ARGV[1] new lease token, ARGV[2] fill_lease_ms,
-- ARGV[3] "1" to grant a lease on a miss, "0" for a plain read.
-- Fields: v = value, n = cached null, l = the current fill lease. While
-- the entry holds only a lease, its TTL is the lease's, so a vanished
-- loader's lease ends with the key.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
    if ARGV[3] == '1' then
        redis.call('HSET', KEYS[1], 'l', ARGV[1])
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return {'granted'}
    end
    return {'miss'}
end
if t ~= 'hash' then
    return {'wrong_type'}
end
local f = redis.call('HMGET', KEYS[1], 'v', 'n', 'l')
if f[1] then
    return {'hit', f[1]}
end
if f[2] then
    return {'null'}
end
if f[3] then
    return {'held', redis.call('PTTL', KEYS[1])}
end
-- A hash without any of our fields was not written by leased.
return {'wrong_type'}
