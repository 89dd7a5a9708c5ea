-- Redis' clock in ms (TIME): every daemon sharing the keys agrees on it.
-- Pasted by lib/sem_shape.lua and lib/cache_shape.lua. Lua's arithmetic
-- reads TIME's two strings as numbers itself: tonumber() and
-- math.floor() would cost each call about 2k Redis instructions more.
local function redis_ms()
    local t = redis.call('time')
    local us = t[2] + 0
    return t[1] * 1000 + (us - us % 1000) / 1000
end
