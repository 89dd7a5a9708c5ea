-- Included by the semaphore scripts (lua2c.sh pastes it in).
-- A semaphore is two keys in one hash slot: a sorted set of grant tokens
-- scored by the absolute time (ms, Redis' clock) their lease ends, and a
-- hash from the same tokens to the permits each holds. Anything else under
-- those names is someone else's data: reported, never changed.
local function sem_now()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
