-- Fences and hold counts as the acquire scripts check them. Fences stay
-- decimal strings: Lua numbers are doubles, exact only up to 2^53, and
-- Redis's INCR is exact up to 2^63-1.
local MAX = '9223372036854775807'

-- A positive integer below 2^63-1 written the way INCR writes it.
local function valid(s)
    if type(s) ~= 'string' or not string.find(s, '^[1-9][0-9]*$') then
        return false
    end
    return #s < #MAX or (#s == #MAX and s < MAX)
end

-- A hold count leased could have written (exact as a Lua number, and
-- far from HINCRBY's overflow).
local function count_ok(s)
    return type(s) == 'string' and #s <= 15
           and string.find(s, '^[1-9][0-9]*$') ~= nil
end

-- A < B for two valid() decimals.
local function less(a, b)
    return #a < #b or (#a == #b and a < b)
end
