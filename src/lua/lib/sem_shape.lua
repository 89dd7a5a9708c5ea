-- Included by the semaphore scripts (lua2c.sh pastes it in).
-- A semaphore is two keys in one hash slot: a sorted set of grant tokens
-- scored by the absolute time (ms, Redis' clock) their lease ends, and a
-- hash from the same tokens to the permits each holds. Anything else under
-- those names is someone else's data: reported, never changed.
local function sem_now()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function sem_shape_ok()
    local z = redis.call('type', KEYS[1]).ok
    local h = redis.call('type', KEYS[2]).ok
    return (z == 'none' or z == 'zset') and (h == 'none' or h == 'hash')
end

-- Permits held by grants whose lease has not ended at NOW.
local function sem_held(now)
    local live = redis.call('zrangebyscore', KEYS[1], '(' .. now, '+inf')
    local held = 0
    for i = 1, #live do
        held = held + (tonumber(redis.call('hget', KEYS[2], live[i])) or 0)
    end
    return held
end
