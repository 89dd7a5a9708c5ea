-- Included by sem_acquire.lua and sem_info.lua (not sem_shape.lua: a
-- closure costs every call of the scripts that do not use it).
-- sem_permits returns the permits the grants TOKENS (a list) hold: one
-- HMGET of the permits hash per thousand grants, not one HGET each
-- (unpack() has a limit on a call's arguments).
local function sem_permits(tokens)
    local held = 0
    for i = 1, #tokens, 1000 do
        local n = redis.call('hmget', KEYS[2],
                             unpack(tokens, i, math.min(i + 999, #tokens)))
        for j = 1, #n do
            held = held + (tonumber(n[j]) or 0)
        end
    end
    return held
end
