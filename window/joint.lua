-- joint.lua: one request decided in several sliding windows at once
-- (Redis.AllowJoint): admitted in all of them, or charged in none.
-- Each window's rule is window.lua's for AllowN.
--
-- KEYS[3i-2]  window i's sorted set (see window.lua), i = 1..parts.
-- KEYS[3i]    window i's pause (see window.lua): while it is in force,
--             the request does not fit in window i.
-- KEYS[3i-1]  window i's clock floor (read and written with a client
--             clock only).
-- ARGV[1]     n, the cost (1 <= n <= every limit, checked by the caller).
-- ARGV[2]     a member identity unique to this request: units are stored
--             as ARGV[2] (n == 1) or ARGV[2]..":"..j, in every window.
-- ARGV[3]     now, µs, from the client's clock, or "" for the server's
--             TIME (rounded up, the windows one µs longer: see window.lua).
-- ARGV[4]     "1" if the client's reading had a part below the µs (the
--             windows one µs longer), else "0".
-- ARGV[5]     with the server's TIME: an instant, µs, after which the
--             script applies nothing and returns {-1, now} (its caller has
--             given up: see window.lua). "": none.
-- ARGV[3+3i]  window i, µs.
-- ARGV[4+3i]  limit i.
-- ARGV[5+3i]  held i: an instant, µs, until which the caller knows window
--             i's set holds a unit (0: none known); a set empty before
--             then was lost, and window i is paused for a window, as
--             window.lua's "Lost sets" says.
--
-- With a client clock, now is clamped to the newest floor of them all.
-- Each window first drops what left it. n fits in a window when count + n
-- <= limit, or, with reservations ahead, when n units at now keep every
-- window containing now within the limit (firstFit's test at now in
-- schedule.go). Only if n fits in every window are the units added, each
-- window's expiry extended (PEXPIRE NX and GT, as window.lua) and, with a
-- client clock, its floor set.
--
-- Returns, per window, three integers as window.lua's replies, then now
-- (putReply
-- in units.lua): code = remaining + 1 when it fits, else -(remaining +
-- 1); retry_us, negated when ahead; reset_us. remaining = limit - units
-- after the request (when it fits) or now; retry_us, when it does not
-- fit, the time until the k-th oldest unit leaves (the tail of the
-- schedule); ahead = reservations lie ahead of now, so a gap before the
-- tail may be earlier (the caller asks Peek).

local n = tonumber(ARGV[1])
local base = ARGV[2]
local parts = #KEYS / 3
local slack = 0
local now
if ARGV[3] ~= "" then
	now = tonumber(ARGV[3])
	if ARGV[4] == "1" then
		slack = 1
	end
	for i = 1, parts do
		local floor = tonumber(redis.call("GET", KEYS[3 * i - 1]))
		if floor and floor > now then
			now = floor
		end
	end
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2] + 1
	slack = 1
	if ARGV[5] ~= "" and now > tonumber(ARGV[5]) then
		return { -1, now }
	end
end

-- fitsNow: n units at now keep the window ending at now, and every window
-- ending at a unit in (now, now + window), within limit.
local function fitsNow(key, window, limit)
	local room = limit - n
	local raw = redis.call("ZRANGE", key, excl(now - window), excl(now + window), "BYSCORE", "WITHSCORES")
	local at = {}
	for i = 2, #raw, 2 do
		at[#at + 1] = tonumber(raw[i])
	end
	local sum = 0
	local q = 1
	while q <= #at and at[q] <= now do
		sum = sum + 1
		q = q + 1
	end
	if sum > room then
		return false
	end
	local lo = 1
	while q <= #at do
		while at[lo] <= at[q] - window do
			lo = lo + 1
		end
		if q == #at or at[q + 1] > at[q] then
			if q - lo + 1 > room then
				return false
			end
		end
		q = q + 1
	end
	return true
end

local res = {}
local counts = {}
local all = true
for i = 1, parts do
	local key = KEYS[3 * i - 2]
	local window = tonumber(ARGV[3 + 3 * i]) + slack
	local nominal = tonumber(ARGV[3 + 3 * i])
	local limit = tonumber(ARGV[4 + 3 * i])
	redis.call("ZREMRANGEBYSCORE", key, "-inf", now - window)
	local count = redis.call("ZCARD", key)
	counts[i] = count
	local top = newestScore(key, now)
	local pausedUntil = tonumber(redis.call("GET", KEYS[3 * i]))
	local paused = pausedUntil and pausedUntil > now
	if not paused and count == 0 and tonumber(ARGV[5 + 3 * i]) > now then
		-- Lost (window.lua's "Lost sets"): recovering for a window.
		pausedUntil, paused = now + window, true
		redis.call("SET", KEYS[3 * i], string.format("%d", pausedUntil), "PX", math.ceil(window / 1000))
	end
	local fits = not paused and (count + n <= limit or (top > now and fitsNow(key, window, limit)))
	local r = 3 * (i - 1)
	if paused then
		all = false
		putReply(res, r, false, 0, pausedUntil - now, math.max(top, pausedUntil) + nominal - now, false)
	elseif fits then
		putReply(res, r, true, limit - count - n, 0, nominal, false)
	else
		all = false
		local k = count + n - limit
		local s = redis.call("ZRANGE", key, excl(now - window), "+inf", "BYSCORE", "LIMIT", k - 1, 1, "WITHSCORES")[2]
		local tail = top
		if s then
			tail = tonumber(s)
		end
		local ahead = top > now
		putReply(res, r, false, limit - count, math.max(tail + window - now, 1), top + nominal - now, ahead)
	end
	if fits and top > now then
		res[r + 3] = top + nominal - now
	end
end
if not all then
	res[#res + 1] = now
	return res
end

for i = 1, parts do
	local key = KEYS[3 * i - 2]
	local window = tonumber(ARGV[3 + 3 * i]) + slack
	local members = {}
	for j = 1, n do
		members[j] = unitName(nil, j, n, base) -- units.lua
	end
	addUnits(key, now, members)
	local ms = math.ceil(window / 1000)
	if not (counts[i] == 0 and redis.call("PEXPIRE", key, ms, "NX") == 1) then
		redis.call("PEXPIRE", key, ms, "GT")
	end
	if ARGV[3] ~= "" then
		redis.call("SET", KEYS[3 * i - 1], now, "PX", ms)
	end
end
res[#res + 1] = now
return res
