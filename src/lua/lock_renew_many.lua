-- The watchdog's renewals of many plain locks in one call: what
-- lock_renew.lua does for one, for each in turn (lease never shortened).
-- Redis pays a command's fixed cost (parsing, the script's set-up, the
-- reply) once for all of them, and one flat array instead of a table per
-- lock. Standalone and Sentinel only: the keys of a call share no slot.
-- KEYS[2i-1] lock hash  KEYS[2i] its force marker (lock_force.lua)
-- ARGV[2i-1] holder field  ARGV[2i] lease in ms (> 0)
-- Returns three numbers per lock, in order: 1, pttl, count when HELD;
-- the code of lock_renew.lua (< 0), 0, 0 otherwise.
local out = {}
local keep = '1'
-- tonumber costs about 1.6k instructions: the watchdog's leases are
-- mostly one value, read once, and most counts are 1.
local lease_s, lease
for i = 1, #KEYS / 2 do
    local key, forced = KEYS[2 * i - 1], KEYS[2 * i]
    local holder = ARGV[2 * i - 1]
    if ARGV[2 * i] ~= lease_s then
        lease_s = ARGV[2 * i]
        lease = tonumber(lease_s)
    end
    local code, v, left
    repeat
--@include renew_open.lua
--@include renew_lease.lua
    until true
    local j = 3 * i
    if code then
        out[j - 2], out[j - 1], out[j] = code, 0, 0
    else
        out[j - 2], out[j - 1] = 1, left
        out[j] = v == '1' and 1 or tonumber(v)
    end
end
return out
