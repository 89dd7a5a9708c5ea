-- Deletes handed over by daemons that stopped (ld_cache_due.c): claim the
-- ones due, each for ARGV[3] ms, so that one daemon carries each out and
-- another takes it over if that one dies before it removes the member.
-- KEYS[1] the due set; ARGV[1] now (ms, wall clock), ARGV[2] how many,
-- ARGV[3] the claim in ms. Returns how many members the set holds (the
-- claimed ones too: they stay until removed), then the members claimed.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1],
                       'LIMIT', 0, ARGV[2])
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[3])
for i = 1, #due do
    redis.call('ZADD', KEYS[1], until_ms, due[i])
end
table.insert(due, 1, redis.call('ZCARD', KEYS[1]))
return due
