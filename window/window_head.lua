-- window_head.lua: the start of window.lua's script, sent before
-- units.lua, plain.lua, grouped.lua and window.lua itself: the instant,
-- and the keys' schedules and pauses. KEYS, ARGV and the reply: see
-- window.lua. The locals below are window.lua's.

-- A lone AllowN of one unit on the server's clock comes in a short form,
-- five arguments fewer for Redis to read: ARGV = ARGV[3] to ARGV[6] and
-- the member of the whole form (see window.lua), whose ARGV[1] and
-- ARGV[2] are "" and "0", and m, n and horizon 1, 1 and -1. The rest of
-- the script, after the lone path below, reads the whole form.
local short = #ARGV == 5
local clientClock = not short and ARGV[1] ~= ""
local spaced = not short and #ARGV[2] > 1 -- "0s" or "1s": WithSpacedReservations
local stride = 3 -- keys per window key
local now0, slack
local nowString -- with the server's TIME: now0 formatted
if clientClock then
	stride = 4
	now0 = tonumber(ARGV[1])
	slack = 0
	if string.byte(ARGV[2]) == 49 then -- "1": the reading lay between two µs (see instant)
		slack = 1
	end
else
	-- TIME truncates to the µs: the real instant lies in [t, t+1µs), so
	-- record admissions at t+1 and let units leave a µs later (see
	-- instant in algorithm.go).
	local t = redis.call("TIME")
	now0 = t[1] * 1000000 + t[2] + 1
	slack = 1
	-- now0 as ZADD takes it, and compared with ARGV[3] as a string (the
	-- same digits, so the longer or, as long, the greater string is the
	-- later instant): a tonumber costs about as much.
	nowString = string.format("%d", now0)
	local e = ARGV[short and 1 or 3]
	if e ~= "" and (#nowString > #e or #nowString == #e and nowString > e) then
		return {-1, now0}
	end
end

-- The schedules and pauses of every key: got[2g - 1] and got[2g] for the
-- g-th key, nil or false when missing. One EXISTS, which costs Redis about
-- half an MGET, and the MGET only when one of them is there (a key with
-- reservations or a pause): most calls have neither.
local got = {}
if short then
	-- A lone call looks only when it must (see below).
elseif #KEYS == stride then
	if redis.call("EXISTS", KEYS[2], KEYS[3]) > 0 then
		got = redis.call("MGET", KEYS[2], KEYS[3])
	end
else
	local names = {}
	for s = 0, #KEYS - 1, stride do
		names[#names + 1] = KEYS[s + 2]
		names[#names + 1] = KEYS[s + 3]
	end
	if redis.call("EXISTS", unpack(names)) > 0 then
		got = redis.call("MGET", unpack(names))
	end
end

-- A lone AllowN of one unit on a plain key (see plainKey in plain.lua, and
-- its expiry marker), decided before any function or table is made: the
-- most calls made one at a time. Its admission replies {code, now} alone
-- (retry 0 and the window as the reset are implied: two integers fewer
-- for Redis to convert). counted is the set's count of units in the
-- window when the unit does not fit (plain.lua's loop starts from it),
-- else nil.
--
-- The marker tells that the key is plain: a set holds one only while its
-- key has neither schedule nor pause, as every path that writes a marker
-- looks first (the EXISTS above, or this path's), and every writer of a
-- schedule or pause drops the markers: window.lua's decisions, and
-- joint.lua's, drop from -inf before they write (a Peek writes nothing),
-- and replan.lua and pause.lua drop them (a schedule lost alone, evicted,
-- leaves reservations that replan.lua may find beside a marker). So a
-- unit added beside its marker in place (ZADD's reply 1) needs no look; a
-- reply of 2 (the marker moved, or was missing) looks, and takes both
-- back when the key has either. A pause set by an earlier version (its
-- pause.lua wrote the pause key alone) is seen here once the marker
-- moves, within half a window; no admission goes over the limit
-- meanwhile (a pause only holds a key below it).
local counted
if short then
	local key, nominal = KEYS[1], ARGV[2] + 0 -- (+ 0: a tonumber without the call)
	local window = nominal + slack
	local count = redis.call("ZCOUNT", key, string.format("(%d", now0 - window), "+inf")
	local limit = ARGV[3] + 0
	local plain -- the key has neither schedule nor pause; nil: not looked yet
	if count + 1 <= limit and not (count == 0 and ARGV[4] ~= "0" and tonumber(ARGV[4]) > now0) then
		local half, need = window + 1999, now0 + window + 999 -- E as plain.lua's
		half, need = (half - half % 2000) / 2000, (need - need % 1000) / 1000
		local e = need - need % half + half
		local score, marker = string.format("%d", e - 9007199254740992), "~e" .. ARGV[2]
		if count == 0 then -- a set with no unit in the window starts anew (see plainKey)
			plain = redis.call("EXISTS", KEYS[2], KEYS[3]) == 0
			if plain then
				local old = redis.call("PEXPIRETIME", key)
				if old ~= -2 then
					redis.call("DEL", key)
				end
				redis.call("ZADD", key, score, marker, nowString, ARGV[5])
				redis.call("PEXPIREAT", key, string.format("%d", math.max(e, old)))
				return {limit - count, now0}
			end
		elseif redis.call("ZADD", key, "GT", "CH", score, marker, nowString, ARGV[5]) == 1 then
			return {limit - count, now0}
		else
			plain = redis.call("EXISTS", KEYS[2], KEYS[3]) == 0
			if plain then
				redis.call("ZREMRANGEBYSCORE", key, "-inf", string.format("%d", now0 - window))
				redis.call("ZADD", key, score, marker)
				redis.call("PEXPIREAT", key, string.format("%d", e), "GT")
				return {limit - count, now0}
			end
			redis.call("ZREM", key, ARGV[5], marker) -- a schedule or a pause: window.lua decides
		end
	end
	if plain == nil then
		plain = redis.call("EXISTS", KEYS[2], KEYS[3]) == 0
	end
	if not plain then
		got = redis.call("MGET", KEYS[2], KEYS[3])
	elseif count ~= 0 then -- it does not fit (0: maybe lost; decideKey looks)
		counted = count
	end
	-- The whole form, from the last argument down.
	ARGV[10], ARGV[9], ARGV[8], ARGV[7] = "-1", ARGV[5], "1", "1"
	ARGV[6], ARGV[5], ARGV[4], ARGV[3], ARGV[2], ARGV[1] = ARGV[4], ARGV[3], ARGV[2], ARGV[1], "0", ""
end
