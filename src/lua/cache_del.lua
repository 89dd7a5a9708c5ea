-- cache.invalidate (first and second delete): drop the entry, whatever it
-- holds, which voids its fill lease too, and wake waiters everywhere.
-- KEYS[1] entry; ARGV[1] channel. Returns the number of keys removed.
local n = redis.call('UNLINK', KEYS[1])
redis.call('PUBLISH', ARGV[1], 'del')
return n
