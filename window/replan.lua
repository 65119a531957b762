-- replan.lua: drop the reservations of one key that lie ahead (their slots
-- were planned under a limit that has gone down), so that their requests
-- are planned again when they come back. Admissions, and reservations
-- whose slot has come, stay.
--
-- KEYS[1]  the key's sorted set (see window.lua).
-- KEYS[2]  the key's schedule (see window.lua): its slot-search hint no
--          longer holds, and is cleared.
-- ARGV[1]  now, µs, from the client's clock; "" for the server's TIME.
--
-- Returns the number of reserved units dropped.
local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end
local ahead = redis.call("ZRANGE", KEYS[1], "(" .. string.format("%d", now), "+inf", "BYSCORE")
local drop = {}
for _, m in ipairs(ahead) do
	if string.byte(m) == 82 then -- "R": a reserved unit
		drop[#drop + 1] = m
	end
end
for i = 1, #drop, 500 do
	redis.call("ZREM", KEYS[1], unpack(drop, i, math.min(i + 499, #drop)))
end
if #drop > 0 and redis.call("EXISTS", KEYS[2]) == 1 then
	-- No reservation lies after now any more; no hint.
	redis.call("SET", KEYS[2], string.format("%d 0 0 0 0 0", now), "KEEPTTL")
end
return #drop
