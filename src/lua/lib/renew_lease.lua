-- Pasted after renew_open.lua in the plain lock's renewals
-- (lock_renew.lua, lock_renew_many.lua). Reads key, lease_s (the lease in
-- ms, a string; 0 only reports), lease (the same as a number) and keep
-- ("1": never shorten the lease, a watchdog renewal after an extend); sets
-- left, the lease now held.
if lease > 0 then
    -- GT never shortens a lease and saves a PTTL: only a lease longer
    -- than the renewal (after an extend) needs asking for.
    if keep ~= '1' then
        redis.call('pexpire', key, lease_s)
        left = lease
    elseif redis.call('pexpire', key, lease_s, 'GT') == 1 then
        left = lease
    end
end
if not left then
    left = redis.call('pttl', key)
    if lease > 0 and left == -1 then
        -- GT leaves a key without a TTL alone: give it the lease.
        redis.call('pexpire', key, lease)
        left = lease
    end
end
