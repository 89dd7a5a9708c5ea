-- cache.release: the loader gives its fill lease up without storing.
-- KEYS[1] entry hash; ARGV[1] lease, ARGV[2] channel.
-- Returns 1 released, 0 when the lease was no longer the current one.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return 0
end
if redis.call('HGET', KEYS[1], 'l') ~= ARGV[1] then
    return 0
end
if redis.call('HEXISTS', KEYS[1], 'v') == 1 or
   redis.call('HEXISTS', KEYS[1], 'n') == 1 then
    redis.call('HDEL', KEYS[1], 'l')
else
    redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[2], 'release')
return 1
