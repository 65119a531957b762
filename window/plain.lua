-- plain.lua: the plain keys of window.lua's script (see plainKey below),
-- sent after window_head.lua (which decides a lone AllowN of one unit
-- itself, before any function is made) and units.lua: the call's leading
-- plain keys are decided here, before the script makes the functions and
-- tables of grouped.lua and window.lua, and window.lua decides the later
-- ones with the same function.
--
-- The expiry marker: a plain key's set holds, beside its units, the member
-- "~e" followed by the window argument (no unit's: AllowN members start
-- with a byte >= 0x80, AllowID's with "A" or "R") scored at E - 2^53, E
-- being an instant in ms until which the key is known to live (its
-- PEXPIREAT). Units only ever need the key to live until the newest of
-- them leaves the window, so an admission at now needs E >= now + window:
-- while it holds, the admission writes no expiry and drops no unit (units
-- out of the window are not counted, and are dropped when E moves, at
-- most every half window, which bounds the set to a window and a half of
-- units). E is rounded up to the next half window so that a busy key
-- moves it only that often: one ZADD of the units and the marker is then
-- most decisions' only write. GT CH: the marker moves only forward, and
-- each member it names counts 1 in the reply when added or moved, the
-- unit too when its call runs again (a client's retry moves it later,
-- which never admits more), so a reply of 2 says the marker moved. A
-- marker of its own per window: after a quota's window shrinks, the old
-- marker's E would hold for up to a window and a half of the old window,
-- and the set would keep that much. When a marker moves, the drop of the
-- units that left the window starts from -inf and takes every marker,
-- and the moved one is written back (a marker dropped is only written
-- again, and the key's expiry, only ever raised, stays at least its E),
-- so a key holds one after each move, even when its window changes at
-- every decision (adaptive's fractions of a call). A set with no unit in
-- the window (a key seen less than once a window: most keys of many) is
-- deleted and written anew, its unit, marker and PEXPIREAT E, or its old
-- expiry when that is later (after a window shrank): one write fewer than
-- a move, and no flags. The score is below 0,
-- below every
-- unit's, so a drop from -inf (every other path of window.lua, joint.lua,
-- and the scripts of earlier versions) takes the markers too, and the
-- next plain decision puts its own back with the key's expiry. Scores
-- counted from 0 skip them.

local out = {} -- three integers per request, key after key (see window.lua)

-- The compact forms ("p", "q": see window.lua) are answered compactly: the
-- count of the leading keys decided here, then one integer for each of
-- them (its first request's code; the j-th request's is j - 1 less), then
-- window.lua's three integers per request of the keys after them.
local compactReply = ARGV[2] == "p" or ARGV[2] == "q"
if compactReply then
	out[1] = 0 -- the count, set once known
end

-- plainWindows holds, per window argument of the call (ARGV strings are
-- interned), {window, "(" .. the count's bound, the drop's bound, the
-- marker's score, E, the marker, E as a number}: tonumber and
-- string.format cost about as much as a redis.call each, and the keys of
-- a call usually share them. plainLimits holds the limits as numbers.
local plainWindows, plainLimits = {}, {}

-- windowOf returns plainWindows' entry for the window argument arg.
local function windowOf(arg)
	local w = plainWindows[arg]
	if not w then
		local nominal = tonumber(arg)
		local window = nominal + slack
		-- E: the ms the key must live to (now + window, rounded up), then
		-- up to the next multiple of half a window (in ms, rounded up: >= 1);
		-- with % for math.ceil and math.floor, which cost a call each.
		local half, need = window + 1999, now0 + window + 999
		half, need = (half - half % 2000) / 2000, (need - need % 1000) / 1000
		local e = need - need % half + half
		w = {nominal, string.format("(%d", now0 - window), string.format("%d", now0 - window), string.format("%d", e - 9007199254740992), string.format("%d", e), "~e" .. arg, e}
		plainWindows[arg] = w
	end
	return w
end

-- limitOf returns the limit argument arg as a number.
local function limitOf(arg)
	local limit = plainLimits[arg]
	if not limit then
		limit = tonumber(arg)
		plainLimits[arg] = limit
	end
	return limit
end

-- plainKey decides the AllowN requests of the plain key key (no schedule
-- and no pause, the server's clock): the most calls' whole work, done
-- without a closure or a table per request. w is windowOf its window,
-- held its held argument, total the units of its requests; member the
-- member of a lone request of one unit, else nil and the requests are
-- ARGV[first] to ARGV[last], step arguments each: three (the whole form's
-- cost, member and horizon) or one (the "q" form's member, of one unit).
-- It returns nil when
-- it decided every request, else the count of units in the window when
-- they do not all fit now, or false when it did nothing (a set that may
-- be lost, or an error on the key, which window.lua's path meets again at
-- its first command, before it writes anything).
local function plainKey(key, w, limit, held, total, member, first, last, step)
	local count = redis.pcall("ZCOUNT", key, w[2], "+inf")
	if type(count) ~= "number" then
		return false
	end
	if count == 0 and held ~= "0" and tonumber(held) > now0 then
		return false -- lost? (see decideKey)
	end
	if count + total > limit then
		return count
	end
	local o = #out
	local fresh, expires = count == 0, w[5]
	if fresh then
		-- Units that left the window, and markers: the set starts anew, its
		-- expiry never sooner than it was (a process that admitted under a
		-- longer window knows the key lives until then: see Lost sets).
		local old = redis.call("PEXPIRETIME", key) -- ms; -2: missing
		if old ~= -2 then
			redis.call("DEL", key)
			if old > w[7] then
				expires = string.format("%d", old)
			end
		end
	end
	if compactReply then
		out[o + 1] = limit - count -- the key's one integer: its first request's code
	end
	local moved
	if member then -- one request of one unit: no table
		if fresh then
			redis.call("ZADD", key, w[4], w[6], nowString, member)
		else
			moved = redis.call("ZADD", key, "GT", "CH", w[4], w[6], nowString, member) == 2
		end
		if not compactReply then
			out[o + 1], out[o + 2], out[o + 3] = limit - count, 0, w[1] -- putReply's, admitted
		end
	else
		-- The units and the marker in one ZADD GT CH (in ZADDs of at most
		-- 499 units, which keep unpack() within Lua's stack): every unit
		-- counts 1 in the replies, and the marker 1 more when it moved.
		local args, k, units, changed = {"GT", "CH", w[4], w[6]}, 4, count, 0
		for i = first, last, step do
			local n, base = 1, ARGV[i]
			if step == 3 then
				base = ARGV[i + 1]
				if ARGV[i] ~= "1" then
					n = tonumber(ARGV[i])
				end
			end
			for j = 1, n do
				if k == 1000 then
					changed = changed + redis.call("ZADD", key, unpack(args))
					args, k = {"GT", "CH"}, 2
				end
				args[k + 1], args[k + 2] = nowString, unitName(nil, j, n, base)
				k = k + 2
			end
			units = units + n
			if not compactReply then
				out[o + 1], out[o + 2], out[o + 3] = limit - units + 1, 0, w[1] -- putReply's, admitted
				o = o + 3
			end
		end
		moved = changed + redis.call("ZADD", key, unpack(args)) == total + 1
	end
	if fresh then
		redis.call("PEXPIREAT", key, expires)
	elseif moved then
		redis.call("ZREMRANGEBYSCORE", key, "-inf", w[3]) -- every marker, and the units that left the window
		redis.call("ZADD", key, w[4], w[6])
		redis.call("PEXPIREAT", key, w[5], "GT")
	end
	return nil
end

-- plain decides the requests of the key whose KEYS start after s and
-- whose ARGV (the whole form) start at a, if it is plain: AllowN requests
-- only (horizon -1); see plainKey, and false for a request of another
-- kind. The caller has seen that its schedule and pause are missing.
local function plain(s, a)
	local first, last = a + 4, a + 3 + 3 * (ARGV[a + 3] == "1" and 1 or tonumber(ARGV[a + 3]))
	local total = 0
	for i = first, last, 3 do
		if ARGV[i + 2] ~= "-1" then
			return false
		end
		if ARGV[i] == "1" then
			total = total + 1
		else
			total = total + tonumber(ARGV[i])
		end
	end
	local member
	if last == first + 2 and total == 1 then
		member = ARGV[first + 1]
	end
	return plainKey(KEYS[s + 1], windowOf(ARGV[a]), limitOf(ARGV[a + 1]), ARGV[a + 2], total, member, first, last, 3)
end

-- The call's leading plain keys. stopKey is the place (from 1) of the
-- first key left to window.lua, and stopArg its first argument; stopCount
-- what plain returned for it (false: not plain, or not tried).
local stopKey, stopArg, stopCount = 1, 4, false
if counted then
	stopCount = counted -- window_head.lua's lone call, which does not fit
elseif compactReply then
	-- The compact forms (see window.lua): every key plain but for its
	-- schedule and pause, which got tells, with AllowN requests of one
	-- unit: "p", one a key (held, member); "q", m a key (held, m, then m
	-- members). a is the first argument of key stopKey.
	local grouped = ARGV[2] == "q"
	local win, lim = ARGV[4], ARGV[5]
	local w, limit, k, a = windowOf(win), limitOf(lim), #KEYS / 3, 6
	while stopKey <= k do
		local g = stopKey
		if got[2 * g - 1] or got[2 * g] then
			break
		end
		local r, next
		if not grouped then
			r, next = plainKey(KEYS[3 * g - 2], w, limit, ARGV[a], 1, ARGV[a + 1]), a + 2
		elseif ARGV[a + 1] == "1" then
			r, next = plainKey(KEYS[3 * g - 2], w, limit, ARGV[a], 1, ARGV[a + 2]), a + 3
		else
			local m = tonumber(ARGV[a + 1])
			next = a + 2 + m
			r = plainKey(KEYS[3 * g - 2], w, limit, ARGV[a], m, nil, a + 2, next - 1, 1)
		end
		if r ~= nil then
			stopCount = r
			break
		end
		stopKey, a = g + 1, next
	end
	out[1] = stopKey - 1
	if stopKey > k then
		out[#out + 1] = now0
		return out
	end
	-- The whole form for window.lua, of the keys from stopKey on, from
	-- ARGV[4]: read first, as it lies where the whole form goes.
	local rest, r = {}, 0
	for _ = stopKey, k do
		local m, first = "1", a + 1
		if grouped then
			m, first = ARGV[a + 1], a + 2
		end
		rest[r + 1], rest[r + 2] = ARGV[a], m
		r = r + 2
		a = first + tonumber(m)
		for i = first, a - 1 do
			r = r + 1
			rest[r] = ARGV[i]
		end
	end
	local b, i = 4, 1
	while i < r do
		local m = rest[i + 1]
		ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3] = win, lim, rest[i], m
		b, i = b + 4, i + 2
		for _ = 1, tonumber(m) do
			ARGV[b], ARGV[b + 1], ARGV[b + 2] = "1", rest[i], "-1"
			b, i = b + 3, i + 1
		end
	end
	ARGV[2] = "0"
	stopArg = 4
	compactReply = false -- window.lua's keys answer three integers a request, plainKey's too
elseif not clientClock then
	for s = 0, #KEYS - 1, stride do
		local g = s / stride + 1
		if got[2 * g - 1] or got[2 * g] then
			break
		end
		local r = plain(s, stopArg)
		if r ~= nil then
			stopCount = r
			break
		end
		local m = ARGV[stopArg + 3]
		stopKey, stopArg = g + 1, stopArg + 4 + 3 * (m == "1" and 1 or tonumber(m))
	end
	if stopKey > #KEYS / stride then
		out[#out + 1] = now0
		return out
	end
end
