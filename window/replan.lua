-- replan.lua: thin one key's reservations ahead to its limit now (which
-- has gone down since they were planned): in slot order, a reservation
-- stays when the window ending at its slot, with the admissions and the
-- reservations kept before it, leaves room for it; else it is dropped,
-- and its request is planned again when it comes back. Every window then
-- holds at most limit units (the fullest window of a log ends at one of
-- its units). Admissions, and reservations whose slot has come, stay.
--
-- KEYS[1]  the key's sorted set (see window.lua).
-- KEYS[2]  the key's schedule (see window.lua): its slot-search hint no
--          longer holds, and is cleared (as in refund.lua).
-- ARGV[1]  now, µs, from the client's clock; "" for the server's TIME.
-- ARGV[2]  the window, µs (its nominal length).
-- ARGV[3]  the limit now (integer >= 1).
--
-- Returns the number of reserved units dropped (a reservation goes whole).
local now
local window = tonumber(ARGV[2])
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2] + 1
	window = window + 1 -- as window.lua: TIME truncates to the µs
end
local limit = tonumber(ARGV[3])
local raw = redis.call("ZRANGE", KEYS[1], "(" .. string.format("%d", now - window), "+inf", "BYSCORE", "WITHSCORES")
-- The entries, oldest first: an admitted unit each, and each reservation
-- ahead whole (its units "R"..i..":"..id share its slot).
local entries, reservation = {}, {}
for i = 1, #raw, 2 do
	local m, at = raw[i], tonumber(raw[i + 1])
	if at > now and string.byte(m) == 82 then -- "R": a reserved unit
		local id = string.match(m, "^R%d+:(.*)$")
		local e = reservation[id]
		if not e then
			e = { at = at, n = 0, members = {} }
			reservation[id] = e
			entries[#entries + 1] = e
		end
		e.n = e.n + 1
		e.members[#e.members + 1] = m
	else
		entries[#entries + 1] = { at = at, n = 1 }
	end
end
local kept, first, sum = {}, 1, 0 -- the entries that stay; kept[first..] within the window, sum units
local drop = {}
for _, e in ipairs(entries) do
	while first <= #kept and kept[first].at <= e.at - window do
		sum = sum - kept[first].n
		first = first + 1
	end
	if e.members and sum + e.n > limit then
		for _, m in ipairs(e.members) do
			drop[#drop + 1] = m
		end
	else
		kept[#kept + 1] = e
		sum = sum + e.n
	end
end
for i = 1, #drop, 500 do
	redis.call("ZREM", KEYS[1], unpack(drop, i, math.min(i + 499, #drop)))
end
if #drop > 0 then
	-- Units left instants ahead: the hint no longer holds. The newest
	-- reservation stays a bound of those left.
	local newest = string.match(redis.call("GET", KEYS[2]) or "", "^(%d+) ")
	if newest then
		redis.call("SET", KEYS[2], newest .. " 0 0 0 0", "KEEPTTL")
	end
end
return #drop
