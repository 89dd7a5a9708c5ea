-- Included by every read-write lock script before lib/rw_open.lua, which
-- uses it, and before the script's own common path. A reader's lease lives in one
-- key per hold, Redisson's "<prefix>:<holder>:rwlock_timeout:<n>", so that
-- each reader's holds expire on their own although they share one hash.
local function rw_tkey(pfx, f, i)
    return pfx .. ':' .. f .. ':rwlock_timeout:' .. i
end
