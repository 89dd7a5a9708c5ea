-- bloom.create: a filter's parameters, written once.
-- KEYS[1] the bitmap (a string, made by the first bloom.add)
-- KEYS[2] the parameters (a hash)
-- ARGV[1] capacity   ARGV[2] error_rate (as the daemon prints it)
-- ARGV[3] m   ARGV[4] k (the daemon's sizing of them)
-- Returns:
--   {1}                        CREATED
--   {0}                        EXISTS, with these very parameters
--   {2, capacity, error_rate, m, k}  OTHER: exists with those (strings)
--   {-1}                       WRONG_TYPE: data leased did not write
--@include bloom_shape.lua
local m, why = bloom_params()
if m then
    local p = redis.call('HMGET', KEYS[2], 'capacity', 'error_rate', 'm', 'k')
    if p[1] == ARGV[1] and p[2] == ARGV[2] and p[3] == ARGV[3] and
        p[4] == ARGV[4] then
        return {0}
    end
    return {2, p[1] or '', p[2] or '', p[3], p[4]}
end
if why == -1 then
    return {-1}
end
-- No parameters but a bitmap: not ours to reuse (its bits were set for
-- other parameters, or by somebody else).
if redis.call('EXISTS', KEYS[1]) == 1 then
    return {-1}
end
redis.call('HSET', KEYS[2], 'capacity', ARGV[1], 'error_rate', ARGV[2],
           'm', ARGV[3], 'k', ARGV[4], 'scheme', '1')
return {1}
