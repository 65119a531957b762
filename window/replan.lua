-- replan.lua: plan one key's reservations ahead again at its limit now
-- when it has gone down since they were planned (some no longer fit at
-- their slots; else nothing moves), in slot order: each
-- moves to the earliest instant, no earlier than its slot, at which the
-- window ending there, with the admissions and the reservations placed
-- before it, has room for it, and no earlier than the one placed before
-- it plus that one's share of the window (window / limit per unit). Every
-- window then holds at most limit units (the fullest window of a log ends
-- at one of its units), the reservations keep their order, and they are
-- spread at the new pace: slots planned at a faster one would otherwise
-- come in bunches, and a full window repeats its bunches window after
-- window. A request whose slot moved is told its new one when it comes
-- back at the old; a reservation of more units than the limit now never
-- fits, and goes. Admissions, and reservations whose slot has come, stay.
--
-- KEYS[1]  the key's sorted set (see window.lua).
-- KEYS[2]  the key's schedule (see window.lua): its slot-search hint no
--          longer holds, and is cleared (as in refund.lua); its bound of
--          the reserved units follows the latest.
-- ARGV[1]  now, µs, from the client's clock; "" for the server's TIME.
-- ARGV[2]  the window, µs (its nominal length).
-- ARGV[3]  the limit now (integer >= 1).
--
-- Reservations of one slot go in the order of their ids (the set orders
-- equal scores by member).
--
-- Returns the number of reserved units moved or gone (a reservation moves
-- whole).
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
-- place returns the slot of each entry once the reservations are placed
-- in order (false: a reservation of more units than the limit, which
-- never fits), and the units whose slot changed: each at the earliest
-- instant, no earlier than its slot, at which the window ending there,
-- with the entries placed before it, has room; with spread, also no
-- earlier than the reservation placed before it plus its share.
local pace = window / limit -- µs of the window per unit at the new limit
local function place(spread)
	local slots, moved, first, sum = {}, 0, 1, 0 -- entries[first..i-1] placed within the window: sum units
	local nextAt = 0 -- no reservation before it, with spread
	for i, e in ipairs(entries) do
		if e.members and e.n > limit then
			slots[i] = false
			moved = moved + e.n
		else
			local at = e.at
			if e.members and spread then
				at = math.max(at, nextAt)
			end
			while true do
				while first < i and (not slots[first] or slots[first] <= at - window) do
					if slots[first] then
						sum = sum - entries[first].n
					end
					first = first + 1
				end
				if not e.members or sum + e.n <= limit then
					break
				end
				at = slots[first] + window -- the oldest in the window leaves
			end
			if at ~= e.at then
				moved = moved + e.n
			end
			slots[i] = at
			sum = sum + e.n
			if e.members then
				nextAt = math.max(nextAt, math.floor(at + e.n * pace))
			end
		end
	end
	return slots, moved
end

local _, overbooked = place(false)
if overbooked == 0 then
	return 0 -- every reservation still fits at its slot
end
local slots, moved = place(true)
local members, drop, newest = {}, {}, 0
for i, e in ipairs(entries) do
	if e.members then
		if not slots[i] then
			for _, m in ipairs(e.members) do
				drop[#drop + 1] = m
			end
		else
			newest = slots[i]
			if slots[i] ~= e.at then
				local score = string.format("%d", slots[i])
				for _, m in ipairs(e.members) do
					members[#members + 1] = score
					members[#members + 1] = m
				end
			end
		end
	end
end
for i = 1, #drop, 500 do
	redis.call("ZREM", KEYS[1], unpack(drop, i, math.min(i + 499, #drop)))
end
for i = 1, #members, 1000 do
	redis.call("ZADD", KEYS[1], "XX", unpack(members, i, math.min(i + 999, #members)))
end
-- Units left instants ahead: the hint no longer holds. The schedule
-- bounds every reserved unit, and lives as window.lua keeps it: until the
-- newest has passed by lateGrace (10 s) and a window.
local bound = math.max(newest, tonumber(string.match(redis.call("GET", KEYS[2]) or "", "^(%d+) ")) or 0)
local ms = math.ceil((bound + 10000000 - now + window) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", "(0") -- no expiry marker beside a schedule (see window_head.lua)
redis.call("SET", KEYS[2], string.format("%d 0 0 0 0", bound), "PX", ms)
redis.call("PEXPIRE", KEYS[1], ms, "GT")
return moved
