-- Included by sem_take.lua and sem_info.lua (not sem_shape.lua: a
-- closure costs every call of the scripts that do not use it).
-- sem_permits returns the permits the grants TOKENS[FROM..] (a list)
-- hold: one HMGET of the permits hash per thousand grants, not one HGET
-- each (unpack() has a limit on a call's arguments). A grant without a
-- field holds one permit: under lock.sem_layout 2 a grant of one permit
-- writes none.
local function sem_permits(tokens, from)
    local held = 0
    for i = from, #tokens, 1000 do
        local n = redis.call('hmget', KEYS[2],
                             unpack(tokens, i, math.min(i + 999, #tokens)))
        for j = 1, #n do
            held = held + (n[j] and tonumber(n[j]) or 1)
        end
    end
    return held
end
