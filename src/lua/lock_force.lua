-- Force unlock (lock.force_unlock): delete the lock (plain or read-write)
-- whatever its holders and publish the wake-up. A marker beside it lives
-- as long as the lease the lock had left, so that a holder's daemon that
-- renews it meanwhile learns it was taken (lock_renew.lua), not that it
-- expired. A reader's lease keys are left to expire.
-- KEYS[1] lock hash  KEYS[2] force marker
-- ARGV[1] unlock channel  ARGV[2] unlock message
-- ARGV[3] unlock channel of a read-write lock (Redisson's differs)
-- Returns (the codes are named in src/core/ld_lock_codes.h): {1, holders}
-- RELEASED: deleted and published, {-1} WRONG_TYPE: the key holds another
-- type or a hash that is not a lock (never changed), {-2} ABSENT: no lock.
--@include lock_shape.lua
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {-2}
end
local rw = t == 'hash' and is_rwlock(KEYS[1])
if t ~= 'hash' or not (rw or is_lock(KEYS[1])) then
    return {-1}
end
local holders = redis.call('hlen', KEYS[1])
if rw then
    holders = holders - 1 -- the "mode" field
end
local left = redis.call('pttl', KEYS[1])
redis.call('del', KEYS[1])
if left > 0 then
    redis.call('set', KEYS[2], '1', 'px', left)
end
if rw then
    -- Redisson's READ_UNLOCK_MESSAGE: every waiter may try.
    redis.call('publish', ARGV[3], '1')
else
    redis.call('publish', ARGV[1], ARGV[2])
end
return {1, holders}
