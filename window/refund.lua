-- refund.lua: take back what one id holds in a window (Redis.Refund).
--
-- KEYS[1]  the key's sorted set (see window.lua).
-- KEYS[2]  the key's schedule (see window.lua): its hint is forgotten when
--          a unit goes (a hint holds only while units are added), its
--          newest reservation kept.
-- ARGV[1]  n, the cost the id was presented with (1 <= n <= MaxCost).
-- ARGV[2]  id: AllowID's identity; its admitted units are members
--          "A"..i..":"..id and its reserved ones "R"..i..":"..id, i = 1..n.
--
-- Removes them all, in batches that keep unpack() within Lua's stack. The
-- key's expiry and clock floor stay (an empty set is deleted by Redis).
--
-- Returns the number of members removed.

local key = KEYS[1]
local n = tonumber(ARGV[1])
local id = ARGV[2]
local removed = 0
for _, kind in ipairs({ "A", "R" }) do
	local i = 1
	while i <= n do
		local batch = {}
		while #batch < 500 and i <= n do
			batch[#batch + 1] = kind .. i .. ":" .. id
			i = i + 1
		end
		removed = removed + redis.call("ZREM", key, unpack(batch))
	end
end
if removed > 0 then
	local newest = string.match(redis.call("GET", KEYS[2]) or "", "^(%d+) ")
	if newest then
		redis.call("SET", KEYS[2], newest .. " 0 0 0 0", "KEEPTTL")
	else
		redis.call("DEL", KEYS[2])
	end
end
return removed
