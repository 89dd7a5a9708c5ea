-- Pasted where a write script stores a value or a null under
-- cache.layout 2 (lib/cache_text.lua tells the layout): KIND "v" or "n",
-- VALUE, the version's text VER and the load time's D ('' for none), for
-- TTL ms. SET replaces whatever the key held, a hash with its lease too.
redis.call('SET', KEYS[1], '\245L' .. kind .. ver .. ':' .. d .. ':'
           .. (kind == 'v' and value or ''), 'PX', ttl)
