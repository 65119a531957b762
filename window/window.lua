-- window.lua: sliding-window-log decisions with reservations, atomically,
-- for one or more keys: every request of a batch in order, at one
-- instant, with exactly the results of the same requests decided one
-- after another. The twin of schedule.go (window.Memory): every rule here
-- is the same.
--
-- KEYS holds three keys per window key (four with a client clock), key
-- after key; below, KEYS[1] to KEYS[4] are those of one key.
-- KEYS[1]  the key's sorted set: one member per unit, scored by its
--          instant in µs since the Unix epoch: admitted units at the
--          instant they were admitted, reserved units at their future
--          slot. A unit at t counts during [t, t+window). Beside them, an
--          expiry marker "~e<window>", scored below 0 (see plain.lua).
-- KEYS[2]  the key's schedule (a string key in the same slot):
--          "N T c limit window". N, an instant in µs, is no earlier than
--          every reserved unit (0: none); only reservations lie after
--          now, so with N not after now an admission's reset is the
--          window, with no look at the set. T c limit window is the hint
--          of slot searches (T 0: none; see hinted below).
-- KEYS[3]  the key's pause (see pause.Suffix): the instant, µs, until which
--          every request is rejected; missing when not paused.
-- KEYS[4]  with a client clock (ARGV[1] not empty) only: the key's clock
--          floor, the newest admission instant (a string key in the same
--          slot).
-- ARGV[1]  now, µs, from the client's clock, clamped to each key's floor
--          so that admissions never move backwards; "" for the server's
--          TIME rounded up (and the window one µs longer).
-- ARGV[2]  "1": the client's reading had a part below the µs (ARGV[1] is
--          rounded up), so the window is one µs longer; else "0". With
--          an "s" after it ("0s", "1s"): WithSpacedReservations, a
--          reservation no earlier than the key's last one plus the share
--          of the window of its units (window * n / limit, rounded down).
-- ARGV[3]  with the server's TIME: an instant, µs, after which the script
--          applies nothing and returns {-1, now}: its caller has given up
--          (Redis was slow or stalled), and an admission nobody knows of
--          must not count. "": none.
-- Then, key after key:
--   window   µs (integer).
--   limit    the most units any window may hold (integer >= 1).
--   held     an instant, µs, until which the caller knows the set holds
--            a unit it saw admitted (0: none known); see "Lost sets".
--   m        the number of requests for the key (>= 1), then m requests,
--            three arguments each:
--     n        the cost (1 <= n <= limit, checked by the caller).
--     member   AllowN: a member identity unique to this request; units
--              are stored as member (n == 1) or member..":"..i.
--              AllowID: the request's id; admitted units are stored as
--              "A"..i..":"..id and reserved ones as "R"..i..":"..id.
--     horizon  -1 for AllowN; -2 for Peek (AllowN's answer, nothing
--              written); else AllowID's reservation horizon, µs (>= 0),
--              or, for AllowIDAfter, "H>A": horizon H and a slot no
--              earlier than now + A µs (A >= 1), which never admits now
--              and gives up a reservation the id holds before then.
--   A call of one AllowN of cost 1 on the server's clock may come in a
--   short form, and its admission be answered {code, now} alone (see
--   window_head.lua).
-- The compact forms, of AllowN requests of cost 1 on the server's clock:
-- ARGV[1] "", ARGV[2] "p" or "q", ARGV[3] as above, ARGV[4] and ARGV[5]
-- the window and limit of every key, then key after key: "p", its held
-- and the member of its one request (two arguments a key where the whole
-- form takes seven; each costs Redis about 1,000 instructions); "q", its
-- held, m and the members of its m requests (2 + m where the whole form
-- takes 4 + 3m: a hot key's flush). plain.lua decides the leading plain
-- keys and answers each with one integer (see compactReply there), and
-- writes the whole form of the keys after them when it hands them to
-- this file.
--
-- For each request: units count while score > now - window; they are
-- dropped once score <= now - window - grace (grace: AllowID's horizon, at
-- most 10 s; 0 for AllowN, and 0 while the schedule has no reservation
-- within the last window and 10 s), so that a reservation that passed
-- unclaimed can still be claimed late. Then, for AllowID: an id with counted
-- admitted units is admitted again without a charge; an id with a future
-- reservation is rejected with the time to it; an id whose slot has come
-- (or passed, within the grace) is admitted now if the last window
-- (now-window, now] leaves room (reservations made after it never delay
-- it), else re-reserved where that window will. Otherwise n units are
-- admitted now if that keeps every window containing now within limit,
-- reservations included; else the earliest such instant is the slot (the
-- tail of the schedule, or a gap before it, however far), reserved
-- for AllowID when it lies within the horizon. Every write extends the
-- key's expiry to cover its newest unit and the grace (PEXPIRE NX and GT:
-- Redis 7.0 or newer).
--
-- Returns three integers per request, in order (key after key), then the
-- places of the keys that failed, if any (see grouped.lua), then now (µs,
-- the instant the script decided at, before any key's floor): code,
-- retry_after_us, reset_after_us (three integers for five values: Redis
-- converts a script's reply element by element). code = remaining + 1
-- when admitted, -(remaining + 1) when rejected: remaining = limit - units
-- held after the decision (reservations included), at least 0.
-- retry_after_us = 0 when admitted (-1: AllowID's id was admitted before,
-- nothing charged), else the time to the slot, negated when the slot is
-- reserved; reset_after_us = newest unit + window - now.
-- Every value stays exact in a Lua number (a double) up to 2^53.
--
-- While KEYS[3] holds an instant after now the key is paused: every
-- request is rejected at once, nothing written, with remaining 0,
-- retry_after_us the time left of the pause and reset_after_us at least
-- as long.
--
-- Lost sets: a set that should hold a unit (held > now) but is gone, while
-- the key is not paused, was lost (FLUSHALL, a restart without its data,
-- eviction, a failover to a replica that lacked it). Units admitted before
-- the loss may still count for up to a window, unseen: the key is paused
-- until now + window (in KEYS[3], for every process), so that it admits
-- nothing beyond what the limit allows whenever the loss happened.
--
-- AllowN requests that fit are batched: their units are written together
-- by one ZADD before any other request reads the set (pending below), and
-- an AllowN rejection that nothing written since could change is answered
-- as the one before it (a rejection of AllowN writes nothing).
--
-- The script starts with window_head.lua (the instant, the schedules and
-- pauses of the keys), units.lua, plain.lua (the leading plain keys
-- decided, and the expiry markers of their sets), grouped.lua, then
-- this file.

-- str returns x (an integer) as a decimal string, formatted once per
-- script call: a number argument of redis.call would be formatted anew by
-- every call (with %.17g, several times dearer).
local strs = {}
if nowString then
	strs[now0] = nowString
end
local function str(x)
	local v = strs[x]
	if not v then
		v = string.format("%d", x)
		strs[x] = v
	end
	return v
end

-- newestAfter returns the newest unit of key if it lies after now, else
-- now. bound is N of its schedule (KEYS[2]): none after now means no unit
-- after now, and no call.
local function newestAfter(key, bound, now)
	if bound <= now then
		return now
	end
	return math.max(newestScore(key, now), now)
end

-- decideKey decides the requests of the key whose KEYS start after s and
-- whose ARGV start at a; g is its place among the keys (from 1).
local function decideKey(s, a, g)
	local known = false -- the count of units in the window, when plain found it
	if g == stopKey then
		known = stopCount -- plain.lua's loop tried it (or found it not plain)
	elseif not clientClock and not got[2 * g - 1] and not got[2 * g] then
		known = plain(s, a)
		if known == nil then
			return
		end
	end
	local key = KEYS[s + 1]
	local floorKey = clientClock and KEYS[s + 4] -- nil with the server's TIME
	local nominal = tonumber(ARGV[a])
	local window = nominal + slack
	local limit = tonumber(ARGV[a + 1])
	local held = tonumber(ARGV[a + 2])
	local first, last = a + 4, a + 3 + 3 * tonumber(ARGV[a + 3])
	local now = now0
	if floorKey then
		local floor = tonumber(redis.call("GET", floorKey))
		if floor and floor > now then
			now = floor
		end
	end
	local pausedUntil = tonumber(got[2 * g])
	-- The schedule (KEYS[2]): newestReserved bounds every reserved unit
	-- from above; hintT (false: none), hintC and hintD are the hint.
	local newestReserved, hintT, hintC, hintD = 0, false, 0, 0
	local hintStored = false -- a hint is stored, for this limit and window or not
	if got[2 * g - 1] then
		local nr, t, c, lim, win, d = string.match(got[2 * g - 1], "^(%d+) (%d+) (%d+) (%d+) (%d+) ?(%d*)$")
		if nr then
			newestReserved = tonumber(nr)
			hintStored = t ~= "0"
			if t ~= "0" and tonumber(lim) == limit and tonumber(win) <= window then
				hintT, hintC, hintD = tonumber(t), tonumber(c), tonumber(d) or 0
			end
		else
			newestReserved = math.huge -- not this script's format: look
		end
	end

	-- Units stay in the set a grace after their window only so that a
	-- reservation that passed unclaimed can still be claimed (see decide).
	-- With none made in the last window and lateGrace (10 s), the schedule
	-- says so, and the set keeps only its window, as for AllowN: a set
	-- several times smaller, and ZCARD for ZCOUNT.
	local late = newestReserved > now - window - 10000000

	-- Paused (Pause): reject every request, writing nothing; retry_after is
	-- the time left, reset_after covers the newest unit as well.
	local function rejectPaused()
		local left = pausedUntil - now
		local reset = left
		local top = newestScore(key, nil)
		if top and top + nominal - now > reset then
			reset = top + nominal - now
		end
		for _ = first, last, 3 do -- one reply per request
			local j = #out
			putReply(out, j, false, 0, left, reset, false)
		end
	end
	if pausedUntil and pausedUntil > now then
		rejectPaused()
		return
	end

	-- Lost (see "Lost sets" above): the set holds no unit while held says
	-- one counts. The fast path's count and drop tell; else one EXISTS does.
	local suspect = held > now
	local function lose()
		pausedUntil = now + window
		redis.call("SET", KEYS[s + 3], str(pausedUntil), "PX", math.ceil(window / 1000))
		rejectPaused()
	end

	-- The fast path: a batch of AllowN and AllowID requests with new ids
	-- (none in the set, none twice) that all fit now. Its results are those
	-- of decide() one after another: each admits at now, as it would, and
	-- the drops of units out of the window and its grace (the smallest grace
	-- of the batch, as the requests one by one would leave it) change no
	-- count and, with no known id, no claim. Built without closures or
	-- tables per request: it is most calls' whole script.
	local stored -- AllowN's count of the set (see the batch below), nil: unknown
	if known then
		stored, suspect = known, false -- plain counted: the requests do not all fit
	end
	do
		local total, grace, ids, fast = 0, 10000000, nil, not known
		for i = first, last, 3 do
			local h = ARGV[i + 2]
			if h == "-2" or string.find(h, ">", 1, true) then
				fast = false
				break
			end
			if ARGV[i] == "1" then
				total = total + 1
			else
				total = total + tonumber(ARGV[i])
			end
			if h == "-1" then
				grace = 0
			else
				grace = math.min(grace, tonumber(h))
				ids = ids or {}
				ids[#ids + 1] = ARGV[i + 1]
			end
		end
		if not late then
			grace = 0
		end
		-- probe: the member of a lone AllowID unit when the set holds no
		-- reserved unit (none made within the last window and lateGrace,
		-- so the drop below leaves none): its ZADD NX, after the count,
		-- is its lookup too, and a known id (ZADD NX added nothing, so
		-- nothing changed) is decided below. This trusts the schedule: one
		-- lost (evicted) while reservations are in the set can waste one
		-- or admit its id early, never over the limit, since the count
		-- holds every unit in the set.
		local probe = nil
		if fast and ids then
			if not late and #ids == 1 and total == 1 then
				probe = "A1:" .. ids[1]
			else
				local names, seen = {}, {}
				for _, id in ipairs(ids) do
					if seen[id] then
						fast = false
						break
					end
					seen[id] = true
					names[#names + 1] = "A1:" .. id
					names[#names + 1] = "R1:" .. id
				end
				if fast then
					local scores = redis.call("ZMSCORE", key, unpack(names))
					for j = 1, #names do
						if scores[j] then
							fast = false
							break
						end
					end
				end
			end
		end
		if fast then
			local dropped = redis.call("ZREMRANGEBYSCORE", key, "-inf", str(now - window - grace))
			local count
			if grace == 0 then
				count = redis.call("ZCARD", key)
				stored = count
			else
				count = redis.call("ZCOUNT", key, "(" .. str(now - window), "+inf")
			end
			-- A set that held members, units out of this window or markers,
			-- was not lost: held may reach beyond this window when the
			-- quota's window shrank since the unit it knows of.
			if suspect and count == 0 and dropped == 0 then
				lose()
				return
			end
			suspect = false
			if count + total <= limit and not (probe and redis.call("ZADD", key, "NX", str(now), probe) == 0) then
				local members = {}
				local reset = newestAfter(key, newestReserved, now) + nominal - now
				local held = count
				local o = #out
				for i = first, last, 3 do
					local n = tonumber(ARGV[i])
					local prefix = nil
					if ARGV[i + 2] ~= "-1" then
						prefix = "A"
					end
					if not probe then -- else written already
						for j = 1, n do
							members[#members + 1] = unitName(prefix, j, n, ARGV[i + 1])
						end
					end
					held = held + n
					putReply(out, o, true, limit - held, 0, reset, false)
					o = o + 3
				end
				if not probe then
					addUnits(key, str(now), members)
				end
				local keep = 0
				if ids then
					keep = 10000000 -- lateGrace: an id is known that long (see decide)
				end
				local ms = str(math.ceil((window + keep) / 1000))
				if not (count == 0 and redis.call("PEXPIRE", key, ms, "NX") == 1) then
					redis.call("PEXPIRE", key, ms, "GT")
				end
				if floorKey then
					redis.call("SET", floorKey, str(now), "PX", str(math.ceil(window / 1000)))
				end
				return
			end
		end
	end

	if suspect and redis.call("EXISTS", key) == 0 then
		lose()
		return
	end

	local function newestUnit()
		return newestAfter(key, newestReserved, now)
	end

	-- The hint (in the schedule, KEYS[2]): an instant T before which no
	-- request of cost c or more fits, learnt by a slot search, so that the
	-- next search starts at T: without it a flood of reservations would
	-- search the same full windows again at every request. It holds while
	-- units are only added or claimed (moved to the claim's instant): units
	-- never leave an instant at or after now except when a claim re-reserves
	-- later. Units gone from instant x make room at most in the windows
	-- that held x, so such a claim marks [now, x + window) as unknown: D,
	-- the end of that range, and the search looks there before it jumps to
	-- T. It counts until T, and only for the same limit and a window no
	-- longer than the current one.
	local scheduleKey = KEYS[s + 2]

	-- writeSchedule stores newestReserved and the hint. The key lives until
	-- the later of them has passed by a window, and newestReserved by
	-- lateGrace more (see late).
	local function writeSchedule()
		if newestReserved == math.huge then
			newestReserved = newestAfter(key, math.huge, now)
		end
		local t = 0
		if hintT and hintT > now then
			t = hintT
		end
		hintStored = t ~= 0
		local d = 0
		if t ~= 0 and hintD > now then
			d = hintD
		end
		local ms = math.ceil((math.max(newestReserved + 10000000, t, now) - now + window) / 1000)
		redis.call("SET", scheduleKey, string.format("%d %d %d %d %d %d", newestReserved, t, hintC, limit, window, d), "PX", ms)
	end

	-- hinted returns the instant T from which a request of cost n may fit,
	-- and D: [now, D) must be searched first (D <= now: nothing to search).
	local function hinted(n)
		if hintT and hintC <= n and hintT > now then
			return hintT, hintD
		end
		return now, now
	end

	-- remember records that nothing of cost n fits before slot (a search
	-- that covered [now, slot)), unless the hint already says more.
	local function remember(slot, n)
		if hintT and hintT > now and (slot < hintT or n > hintC) then
			return
		end
		hintT, hintC, hintD = slot, n, 0
		writeSchedule()
	end

	-- vacated marks the instants that units leaving instant x (<= now) may
	-- have made room at: [now, x + window).
	local function vacated(x)
		if hintT and hintT > now then
			if x + window > hintD then
				hintD = x + window
				writeSchedule()
			end
		elseif hintStored then
			hintT, hintC, hintD, hintStored = false, 0, 0, false
			writeSchedule()
		end
	end

	-- decide is one request, on the set as it is (pending written first),
	-- with its slot no earlier than now + delay (AllowIDAfter, else 0).
	local function decide(n, base, horizon, delay)
		local withID = horizon >= 0
		local peek = horizon == -2
		-- A reservation that left the window unclaimed can still be claimed,
		-- with its priority, for this long (lateGrace in schedule.go): its
		-- units stay in the set, uncounted, until then.
		local grace = 0
		if withID and late then
			grace = math.min(horizon, 10000000)
		end


		if not peek then
			redis.call("ZREMRANGEBYSCORE", key, "-inf", now - window - grace)
		end
		local count
		if grace == 0 and not peek then
			count = redis.call("ZCARD", key)
		else
			count = redis.call("ZCOUNT", key, excl(now - window), "+inf")
		end

		-- The hot path, straight-line (the helpers below are closures, built on
		-- every call): one unit of AllowN, or of AllowID with a new id, that fits.
		-- It does what admit() does.
		local known -- AllowID: ZMSCORE of the id's admitted and reserved units
		if n == 1 and count < limit and not peek and delay == 0 then
			local member, keep = base, 0
			if withID then
				known = redis.call("ZMSCORE", key, "A1:" .. base, "R1:" .. base)
				member, keep = "A1:" .. base, 10000000
			end
			if not (known and (known[1] or known[2])) then
				redis.call("ZADD", key, now, member)
				local ms = math.ceil((window + keep) / 1000)
				if not (count == 0 and redis.call("PEXPIRE", key, ms, "NX") == 1) then
					redis.call("PEXPIRE", key, ms, "GT")
				end
				if floorKey then
					redis.call("SET", floorKey, now, "PX", math.ceil(window / 1000))
				end
				return {1, limit - count - 1, 0, newestUnit() + nominal - now, 0}
			end
		end

		-- zadd adds the request's n units at score (see unitName).
		local function zadd(score, prefix)
			local members = {}
			for i = 1, n do
				members[i] = unitName(prefix, i, n, base)
			end
			addUnits(key, score, members)
			count = count + n
		end

		-- expire makes the key live until its newest unit at score leaves the
		-- window and, for AllowID, the longest grace after it; fresh: the key
		-- may not have existed before this call wrote it (nothing was counted),
		-- so may have no expiry.
		local function expire(score, fresh)
			local keep = 0
			if withID then
				keep = 10000000
			end
			local ms = math.ceil((score + window + keep - now) / 1000)
			if not (fresh and redis.call("PEXPIRE", key, ms, "NX") == 1) then
				redis.call("PEXPIRE", key, ms, "GT")
			end
		end

		local function newest()
			return newestScore(key, now)
		end

		local function admit()
			if peek then
				return {1, math.max(limit - count - n, 0), 0, math.max(newest(), now) + nominal - now, 0}
			end
			local fresh = count == 0
			if withID then
				zadd(now, "A")
			else
				zadd(now, nil)
			end
			expire(now, fresh)
			if floorKey then
				redis.call("SET", floorKey, now, "PX", math.ceil(window / 1000))
			end
			return {1, math.max(limit - count, 0), 0, newestUnit() + nominal - now, 0}
		end

		local function reject(slot, reserve)
			if reserve then
				local fresh = count == 0
				zadd(slot, "R")
				expire(slot, fresh)
				if slot > newestReserved then
					newestReserved = slot
					writeSchedule()
				end
			end
			return {0, math.max(limit - count, 0), slot - now, newest() + nominal - now, reserve and 1 or 0}
		end

		-- kth returns the score of the k-th oldest unit after from (k >= 1),
		-- by rank: O(log N), where BYSCORE with LIMIT would walk k units.
		local function kth(from, k)
			local r = redis.call("ZCOUNT", key, "-inf", string.format("%d", from)) + k - 1
			local s = redis.call("ZRANGE", key, r, r, "WITHSCORES")[2]
			if s then
				return tonumber(s)
			end
			return newest()
		end

		-- firstFit returns the first instant in [from, stop) at which n
		-- units fit (every window containing it stays within limit), or nil.
		-- at[] holds every unit in range.
		local function firstFit(from, stop, tail)
			from = math.min(from, tail)
			-- No room anywhere in [from, tail) when the units in [tail -
			-- window, from] are too many: each of them counts at every instant
			-- of it.
			if from >= stop or redis.call("ZCOUNT", key, string.format("%d", tail - window), string.format("%d", from)) > limit - n then
				return nil
			end
			local raw = redis.call("ZRANGE", key, excl(from - window), excl(stop + window), "BYSCORE", "WITHSCORES")
			local at = {}
			for i = 2, #raw, 2 do
				at[#at + 1] = tonumber(raw[i])
			end
			local len = #at
			local room = limit - n
			local lo, hi, sum = 1, 1, 0
			local q, qlo, qhi, qsum = 1, 1, 1, 0
			local s = from
			while s < stop do
				while hi <= len and at[hi] <= s do
					sum = sum + 1
					hi = hi + 1
				end
				while lo < hi and at[lo] <= s - window do
					sum = sum - 1
					lo = lo + 1
				end
				if q < hi then
					q = hi
				end
				local bad = false
				while q <= len and at[q] < s + window do
					while qhi <= len and at[qhi] <= at[q] do
						qsum = qsum + 1
						qhi = qhi + 1
					end
					while qlo < qhi and at[qlo] <= at[q] - window do
						qsum = qsum - 1
						qlo = qlo + 1
					end
					if qsum > room then
						bad = true
						break
					end
					q = qhi
				end
				if sum <= room and not bad then
					return s
				end
				local nxt = s + 1
				if sum > room and at[lo] + window > nxt then
					nxt = at[lo] + window
				end
				if bad and at[q] + 1 > nxt then
					nxt = at[q] + 1
				end
				s = nxt
			end
			return nil
		end

		-- search is firstFit over [from, stop), 16 windows at a time: each
		-- step reads only the units of its own range (and a window either
		-- side), so a search reads little beyond the gap it finds, however
		-- long the schedule. The result is firstFit's over the whole range:
		-- the first fit at or after each step's start is the earliest there.
		local function search(from, stop, tail)
			while from < stop do
				local to = math.min(stop, from + 16 * window)
				local found = firstFit(from, to, tail)
				if found then
					return found
				end
				from = to
			end
			return nil
		end

		if withID then
			local s = known or redis.call("ZMSCORE", key, "A1:" .. base, "R1:" .. base)
			if s[1] and tonumber(s[1]) > now - window then
				-- Admitted before: retry 1, marked, is the reply's -1.
				return {1, math.max(limit - count, 0), 1, newest() + nominal - now, 1}
			end
			if s[2] then
				local slot = tonumber(s[2])
				if slot > now and slot >= now + delay then
					return {0, math.max(limit - count, 0), slot - now, newest() + nominal - now, 1}
				end
				-- Its slot has come (judged on the last window alone), or
				-- lies before now + delay (searched for anew below).
				local units = {}
				for i = 1, n do
					units[i] = "R" .. i .. ":" .. base
				end
				local removed = redis.call("ZREM", key, unpack(units))
				if slot > now - window then
					count = count - removed -- else it was no longer counted
				end
				if delay > 0 then
					vacated(slot)
				else
					-- Judged on what is ahead of it: admissions, and reservations for
					-- earlier slots (ahead in schedule.go).
					if redis.call("ZCOUNT", key, excl(now - window), now) + n <= limit then
						return admit()
					end
					-- Every unit before its slot is ahead of it; of those at or
					-- after it, the admissions only. A claim comes about on time,
					-- so [slot, now] is read member by member, not the window.
					local from, before = slot, 0
					if slot > now - window then
						before = redis.call("ZCOUNT", key, excl(now - window), excl(slot))
					else
						from = excl(now - window)
					end
					local raw = redis.call("ZRANGE", key, from, now, "BYSCORE", "WITHSCORES")
					local later = {} -- scores of the admissions in [slot, now], oldest first
					for i = 1, #raw, 2 do
						if string.byte(raw[i]) ~= 82 then -- 82: "R"
							later[#later + 1] = tonumber(raw[i + 1])
						end
					end
					if before + #later + n <= limit then
						return admit()
					end
					-- Its units move from its slot to later than now: instants
					-- of the windows that held them may have room again. They
					-- go where the k-th oldest unit ahead of them leaves.
					vacated(slot)
					local k = before + #later + n - limit
					local leaves
					if k <= before then
						leaves = kth(now - window, k)
					else
						leaves = later[k - before]
					end
					return reject(leaves + window, true)
				end
			end
		end

		if delay == 0 and count + n <= limit then
			return admit()
		end

		-- The tail of the schedule always fits: after the k-th oldest unit
		-- leaves (anywhere from start when the units and n are within limit).
		local start = now + delay
		local tail = start
		if count + n > limit then
			if spaced and withID then
				local last = newestScore(key, now)
				if last > now then
					start = math.max(start, last + math.floor(n * window / limit))
				end
			end
			tail = math.max(start, kth(now - window, count + n - limit) + window)
		end
		local slot = tail
		local top = newestScore(key, now)
		if top > start then
			-- Reservations ahead: look for a gap before the tail (firstFit in
			-- schedule.go), however far: in what the hint marks as unknown
			-- ([now, D)), then from the hint's instant (no room before it)
			-- or start.
			local from, unknownUntil = hinted(n)
			local found
			if unknownUntil > start then
				found = search(start, math.min(unknownUntil, tail), tail)
			end
			if not found then
				found = search(math.max(from, unknownUntil, start), tail, tail)
			end
			slot = found or tail
			-- Only a search from now learns where nothing fits.
			if slot > now and not peek and delay == 0 then
				remember(slot, n)
			end
		end

		if slot == now then
			return admit()
		end
		return reject(slot, withID and slot - now <= horizon)
	end

	-- The batch. out holds three integers per request. stored is the number of
	-- units in the set once those out of the window are dropped (AllowN's
	-- view), nil when unknown; pending are AllowN units admitted at now and
	-- not yet written (npending of them), whose replies at pendingAt may need
	-- a later reset once written.
	local pending, npending, pendingAt = {}, 0, {}
	local rejected -- {n, reply}: the last AllowN rejection, while nothing was written since

	local function write()
		if npending == 0 then
			return
		end
		addUnits(key, str(now), pending)
		local ms = math.ceil(window / 1000)
		if not (stored == 0 and redis.call("PEXPIRE", key, ms, "NX") == 1) then
			redis.call("PEXPIRE", key, ms, "GT")
		end
		if floorKey then
			redis.call("SET", floorKey, now, "PX", ms)
		end
		local top = newestUnit()
		if top > now then
			-- A reservation is newer than the units just admitted.
			for _, at in ipairs(pendingAt) do
				out[at + 3] = top + nominal - now
			end
		end
		stored = stored + npending
		pending, npending, pendingAt = {}, 0, {}
	end

	for i = first, last, 3 do
		local n = tonumber(ARGV[i])
		local base = ARGV[i + 1]
		local horizon, delay = ARGV[i + 2], 0
		local mark = string.find(horizon, ">", 1, true)
		if mark then
			horizon, delay = tonumber(string.sub(horizon, 1, mark - 1)), tonumber(string.sub(horizon, mark + 1))
		else
			horizon = tonumber(horizon)
		end
		local at = #out
		local reply
		if horizon == -1 then
			if not stored then
				redis.call("ZREMRANGEBYSCORE", key, "-inf", now - window)
				stored = redis.call("ZCARD", key)
			end
			local count = stored + npending
			if count + n <= limit then
				for j = 1, n do
					pending[npending + j] = unitName(nil, j, n, base)
				end
				npending = npending + n
				pendingAt[#pendingAt + 1] = at
				reply = {1, limit - count - n, 0, nominal, 0}
				rejected = nil
			elseif rejected and rejected[1] == n then
				reply = rejected[2]
			else
				write()
				reply = decide(n, base, horizon, 0)
				if reply[1] == 1 then
					-- Admitted in a gap before reservations: written.
					stored, rejected = nil, nil
				else
					rejected = {n, reply}
				end
			end
		else
			write()
			reply = decide(n, base, horizon, delay)
			if horizon ~= -2 then
				stored, rejected = nil, nil
			end
		end
		putReply(out, at, reply[1] == 1, reply[2], reply[3], reply[4], reply[5] == 1)
	end
	write()
end

-- The keys one after another from the first plain.lua left (eachKey:
-- internal/redisscript/grouped.lua): four header arguments per key, three
-- per request, three integers per reply; then now.
local reply = eachKey(out, stride, stopArg, 4, 3, 3, decideKey, (stopKey - 1) * stride)
reply[#reply + 1] = now0
return reply
