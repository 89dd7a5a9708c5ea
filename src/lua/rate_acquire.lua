-- One decision of a rate limiter: may PERMITS be taken now?
-- KEYS[1] the limiter's key (a string)
-- ARGV[1] rate   ARGV[2] per_ms   ARGV[3] burst   ARGV[4] permits
-- GCRA (the generic cell rate algorithm): the key holds one time, the
-- theoretical arrival time TAT, in microseconds of Redis' clock: when the
-- bucket would be full again. Each permit pushes it on by T = per_ms /
-- rate; a request is granted when the pushed TAT is at most burst * T
-- ahead of now. T need not be a whole microsecond, so the TAT is kept as
-- "US:NUM:DEN" = US + NUM/DEN microseconds, exact in integers (DEN is the
-- rate it was written with). The key expires when the bucket is full.
-- Returns:
--   {1, next}    GRANTED; NEXT: ms until one more permit could be granted
--   {0, wait}    REFUSED; WAIT: ms until PERMITS could be granted
--   {-1}         WRONG_TYPE: the key holds data leased did not write
local rate = tonumber(ARGV[1])
local per_us = tonumber(ARGV[2]) * 1000
local burst = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local t = redis.call('time')
local now = t[1] * 1000000 + t[2]

local cur = redis.pcall('get', KEYS[1])
if type(cur) == 'table' and cur.err then
    if string.find(cur.err, 'WRONGTYPE', 1, true) then
        return {-1}
    end
    return cur
end
local us, num = now, 0
if cur then
    local s, n, d = string.match(cur, '^(%d+):(%d+):(%d+)$')
    if not s then
        return {-1}
    end
    s, n, d = tonumber(s), tonumber(n), tonumber(d)
    if d ~= rate and n > 0 then
        -- Written at another rate: round the fraction up, never down.
        s, n = s + 1, 0
    end
    if s > now or (s == now and n > 0) then
        us, num = s, n
    end
end

-- K permits last K * per_us / rate microseconds: whole part and
-- remainder in 1/rate. Every product stays below 2^53 (the daemon
-- bounds burst * per_ms / rate).
local q1 = math.floor(per_us / rate)
local r1 = per_us - q1 * rate
local function span(k)
    local r = k * r1
    local q = math.floor(r / rate)
    return k * q1 + q, r - q * rate
end

local function add(a, an, b, bn)
    local n = an + bn
    if n >= rate then
        return a + b + 1, n - rate
    end
    return a + b, n
end

-- Microseconds (A + AN/rate), rounded up to whole milliseconds.
local function to_ms(a, an)
    if an > 0 then
        a = a + 1
    end
    if a <= 0 then
        return 0
    end
    return math.floor((a + 999) / 1000)
end

local pq, pr = span(want)
local nus, nnum = add(us, num, pq, pr)
local tq, tr = span(burst)
-- Granted when NEW - now <= burst * T.
local aq, an = nus - now, nnum
if aq < tq or (aq == tq and an <= tr) then
    redis.call('set', KEYS[1],
               string.format('%d:%d:%d', nus, nnum, rate),
               'px', tostring(to_ms(aq, an)))
    -- One more permit: NEW + T - burst*T - now.
    local oq, orr = span(1)
    local xq, xn = add(aq, an, oq, orr)
    local dq, dn = xq - tq, xn - tr
    if dn < 0 then
        dq, dn = dq - 1, dn + rate
    end
    return {1, to_ms(dq, dn)}
end
local dq, dn = aq - tq, an - tr
if dn < 0 then
    dq, dn = dq - 1, dn + rate
end
return {0, to_ms(dq, dn)}
