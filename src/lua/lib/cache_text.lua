-- Pasted where a script has read a string key (no closure: each costs
-- every call): S, GET's answer, as the fields entry_fields gives, in f,
-- and how many there are, in len; f stays nil for a string leased did not
-- write.
-- An entry holding a value or a null and nothing else (no lease, no stale
-- mark) is written under cache.layout 2 as one string, which a hit reads
-- with a plain GET: the byte 0xF5 (which starts no UTF-8 text), "L", "v"
-- (a value) or "n" (a null), the version's digits (r), ":", the load
-- time's digits (d, a value only) or nothing, ":", then the value's bytes
-- (nothing for a null).
if type(s) == 'string' then
    local k, r, d, at = string.match(s, '^\245L([vn])(%d+):(%d*):()')
    if r and #r > 16 then
        k = nil -- a version leased writes is below 2^53
    end
    if k == 'v' then
        if d == '' then
            f, len = {string.sub(s, at), false, false, false, false, false,
                      r}, 2
        else
            f, len = {string.sub(s, at), false, false, false, d, false, r}, 3
        end
    elseif k == 'n' and d == '' and at == #s + 1 then
        f, len = {false, '1', false, false, false, false, r}, 2
    end
end
