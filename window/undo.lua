-- undo.lua: take back the admission of an AllowID call whose reply was
-- lost (the caller timed out, so the message goes back and is decided
-- again): remove the id's admitted units, if they are recent, so that its
-- next decision charges it once, at the instant it really runs.
--
-- KEYS[1]  the key's sorted set (see window.lua).
-- ARGV[1]  n, the call's cost.
-- ARGV[2]  the id.
-- ARGV[3]  within, µs: only units admitted less than this ago are removed
--          (an earlier admission of the same id stays).
-- ARGV[4]  optional: now, µs, from the client's clock. Absent: TIME.
--
-- Returns the number of units removed.

local now
if ARGV[4] then
	now = tonumber(ARGV[4])
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end
local removed = 0
for i = 1, tonumber(ARGV[1]) do
	local member = "A" .. i .. ":" .. ARGV[2]
	local score = redis.call("ZSCORE", KEYS[1], member)
	if score and tonumber(score) > now - tonumber(ARGV[3]) then
		removed = removed + redis.call("ZREM", KEYS[1], member)
	end
end
return removed
