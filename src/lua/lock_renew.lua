-- Renew (watchdog), extend, or check a holder's lease.
-- KEYS[1] lock hash
-- ARGV[1] holder field
-- ARGV[2] lease in ms; 0 only reports
-- ARGV[3] "1": never shorten the lease (watchdog renewal after an extend)
-- Returns {1, pttl, count} held, {-1} the key holds another type,
-- {-2} no lock, {-3} held by another holder.
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
    return {-2}
end
if t ~= 'hash' then
    return {-1}
end
local v = redis.call('hget', KEYS[1], ARGV[1])
if not v then
    return {-3}
end
local lease = tonumber(ARGV[2])
if lease > 0 then
    local left = redis.call('pttl', KEYS[1])
    if ARGV[3] ~= '1' or left < 0 or left < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
end
return {1, redis.call('pttl', KEYS[1]), tonumber(v) or 0}
