-- cache.set: unconditional write; any outstanding fill lease is void.
-- KEYS[1] entry hash; ARGV[1] "v" or "n", ARGV[2] value, ARGV[3] ttl_ms
-- (already jittered), ARGV[4] channel. Returns 1, or -1 wrong type.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
    return -1
end
redis.call('DEL', KEYS[1])
if ARGV[1] == 'v' then
    redis.call('HSET', KEYS[1], 'v', ARGV[2])
else
    redis.call('HSET', KEYS[1], 'n', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], 'set')
return 1
