-- Pasted where rw_acquire.lua grants a new reader: answers its fence,
-- the counter cur (checked by valid()) and never below floor, what this
-- daemon handed out. Below 10^15 (exact as a Lua number) it goes alone,
-- as lock_acquire.lua's free-lock grant does.
local f = cur or '0'
if less(f, floor) then
    f = floor
end
if #f < 16 then
    return tonumber(f)
end
return {1, 1, f, tonumber(ARGV[1])}
