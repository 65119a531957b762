-- bucket_f017374.lua: bucket.lua as commit f017374 sent it (with its
-- preludes, internal/redisscript/grouped.lua and convert.lua, in that
-- order): the script of the processes of that release. KEYS: bucket and
-- pause, bucket after bucket; ARGV: now, then per bucket per, count, cap,
-- held, m and m requests of min and max. TestOldAndNewScriptsShareKeys
-- runs it beside the current script on the same keys (a rolling
-- upgrade), and BenchmarkScriptCPU weighs the two.
-- grouped.lua: the outer loop of a script that decides, in one call, the
-- requests of several keys (Grouped), prepended to it (GroupedLua).
--
-- KEYS holds stride keys per key, key after key. ARGV, from a, holds per
-- key header arguments, the last of them m (its number of requests), then
-- m requests of perRequest arguments each. decide(s, a, g) decides the
-- key whose KEYS start after s and whose ARGV start at a, g being its
-- place (from 1), appending replies integers per request to out.
--
-- With several keys, a key whose commands fail (a key of another type
-- under the prefix, say) fails alone: its replies are zeros and its place
-- is listed after every reply, for the caller to send it again by itself
-- (and get the error). A script must fail at a key's first command, before
-- anything of the key is written. With one key, an error fails the call.
local function eachKey(out, stride, a, header, perRequest, replies, decide)
	local failed = {}
	for s = 0, #KEYS - 1, stride do
		local g = s / stride + 1
		local m = tonumber(ARGV[a + header - 1])
		if #KEYS == stride then
			decide(s, a, g)
		else
			local mark = #out
			if not pcall(decide, s, a, g) then
				for i = mark + 1, #out do
					out[i] = nil
				end
				for i = mark + 1, mark + replies * m do
					out[i] = 0
				end
				failed[#failed + 1] = g
			end
		end
		a = a + header + perRequest * m
	end
	for _, g in ipairs(failed) do
		out[#out + 1] = g
	end
	return out
end
-- convert.lua: the prelude of every bucket script that reads a bucket
-- (Go prepends it to bucket.lua, bucket_id.lua, giveback.lua, peek.lua and
-- refund.lua): load, store, convert, clock, refill and giveBack.
--
-- A bucket is a string key of 25 bytes: the byte 1 (the layout's
-- version), then its credit (an integer, negative with a debt of
-- reservations), the instant ts it was measured at (µs since the Unix
-- epoch) and the period per it is counted in (µs per token), each a
-- little-endian IEEE 754 double (exact for integers up to 2^53). One SET
-- PX writes it and its expiry. Binary, not text: Lua's struct.unpack and
-- struct.pack cost a fraction of string.match and string.format, about a
-- sixth of the script's work per bucket.

-- maxExact is 2^53: every integer up to it is exact in a double.
local maxExact = 9007199254740992

-- bucketOf returns credit, ts and per if they form a bucket (integers,
-- |credit| and ts within 2^53, per in [1, 2^53]; NaN fails every test;
-- per may be nil, for a hash of the oldest layout), else raises WRONGTYPE
-- naming what the key holds (form).
local function bucketOf(credit, ts, per, form)
	if credit and ts and math.abs(credit) <= maxExact and credit == math.floor(credit) and ts >= 0 and ts <= maxExact and ts == math.floor(ts) and (per == nil or (per >= 1 and per <= maxExact and per == math.floor(per))) then
		return credit, ts, per
	end
	error({err = "WRONGTYPE the key holds a " .. form .. " that is not a token bucket"})
end

-- load returns the credit, ts and per stored at key, or nil when the key
-- is missing. Earlier layouts are read as well, and the next store
-- replaces them: the text "credit ts per" and the hash {tokens, ts, per}
-- (per may be missing there, for the current period). A key of another
-- type, a hash without numeric tokens and ts, or a string of another form
-- is an error (WRONGTYPE): never read as a full bucket, and never
-- overwritten.
local function load(key)
	local v = redis.pcall("GET", key)
	if type(v) == "string" and #v == 25 and string.byte(v) == 1 then
		local credit, ts, per = struct.unpack("<ddd", v, 2)
		return bucketOf(credit, ts, per, "string")
	end
	if not v then
		return nil
	end
	if type(v) == "table" then -- an error reply: not a string
		local st = redis.call("HMGET", key, "tokens", "ts", "per")
		local per = nil
		if st[3] then
			per = tonumber(st[3]) or -1 -- not a number: not a bucket
		end
		return bucketOf(tonumber(st[1]), tonumber(st[2]), per, "hash")
	end
	local c, t, p = string.match(v, "^(%-?%d+) (%d+) (%d+)$")
	return bucketOf(tonumber(c), tonumber(t), tonumber(p), "string")
end

-- store writes the bucket at key, expiring in ttl ms (>= 1).
local function store(key, credit, ts, per, ttl)
	redis.call("SET", key, struct.pack("<Bddd", 1, credit, ts, per), "PX", string.format("%d", ttl))
end

-- convert returns credit, counted in the period sp (µs per token, the
-- stored per; nil: the current one), counted in per instead: the
-- same credit when the period is the same, but a debt no deeper than
-- 2^53 - cap (a quota with a larger burst allows a smaller debt);
-- otherwise its whole tokens (floor, so a partial debt counts as a whole
-- token) within [-floor((2^53 - cap) / per), cap / per] tokens, times per.
-- A quota whose period changed (WithQuotas, or a new Rate.Per) so keeps
-- the bucket's whole tokens. params.convert in quota.go is the twin.
local function convert(credit, sp, per, cap)
	if sp == nil or sp == per then
		return math.max(credit, cap - maxExact)
	end
	local t = math.floor(credit / sp)
	local lo = -math.floor((maxExact - cap) / per)
	if t > cap / per then
		t = cap / per
	elseif t < lo then
		t = lo
	end
	return t * per
end

-- clock returns now, µs since the Unix epoch: arg (the client's clock)
-- when it is given and not "", else the server's TIME.
local function clock(arg)
	if arg and arg ~= "" then
		return tonumber(arg)
	end
	local t = redis.call("TIME")
	return t[1] * 1000000 + t[2]
end

-- refill reads the bucket at key at now and returns its credit (counted
-- in per: convert), the instant it is read at, and whether the key was
-- missing. A missing bucket is full at now. Else the credit grows by count per µs
-- since the stored ts, up to cap; a now before ts counts as no time
-- passing, and the instant is ts (stored time never moves backwards).
local function refill(key, per, count, cap, now)
	local credit, ts, sp = load(key)
	if credit == nil or ts == nil then
		return cap, now, true
	end
	credit = convert(credit, sp, per, cap)
	if now > ts then
		-- Beyond cap the product may be inexact; it is clamped to cap anyway.
		credit = credit + (now - ts) * count
		ts = now
	end
	if credit > cap then
		credit = cap
	end
	return credit, ts
end

-- giveBack returns n tokens to the bucket at key (its credit counted in
-- per: convert), up to cap, without moving its ts, and returns the credit
-- stored after (cap when full). A missing bucket is full and stays
-- missing. Its expiry never comes sooner than it was: a process that took
-- tokens knows the key lives until then, and takes a key missing before
-- then for one Redis lost (see bucket.lua). It moves to the instant the
-- bucket is full again, ts + ceil((cap - credit) / count), if that is
-- later; a bucket full already is stored full until its old expiry.
local function giveBack(key, per, count, cap, n, now)
	local credit, ts, sp = load(key)
	if credit == nil or ts == nil then
		return cap
	end
	local keep = redis.call("PTTL", key) -- ms; < 0: no expiry
	credit = convert(credit, sp, per, cap) + n * per
	if credit > cap then
		credit = cap
	end
	if now < ts then
		now = ts
	end
	local full = math.floor((cap - credit) / count)
	if full * count < cap - credit then
		full = full + 1
	end
	local left = ts + full - now
	if left <= 0 then
		if keep > 0 then
			store(key, cap, ts, per, keep)
		else
			redis.call("DEL", key)
		end
		return cap
	end
	local ttl = math.floor(left / 1000)
	if ttl * 1000 < left then
		ttl = ttl + 1
	end
	if keep > ttl then
		ttl = keep
	end
	store(key, credit, ts, per, ttl)
	return credit
end
-- bucket.lua: take tokens from one or more token buckets, atomically, for
-- every request of a batch in order, at one instant: exactly the results
-- of the same requests made one after another. AllowN(n) is a request with
-- min = max = n; the Hybrid's lease has min <= max.
--
-- The bucket is kept in integer credit, so that every step is exact in
-- Lua's doubles: one token is worth per units and every microsecond adds
-- count units; a full bucket holds cap = burst * per (<= 2^53, checked by
-- the caller).
--
-- KEYS holds two keys per bucket, bucket after bucket; below, KEYS[1] and
-- KEYS[2] are those of one bucket.
-- KEYS[1]  the bucket: credit, ts and per, packed (see convert.lua), credit
--          at ts (an integer), ts = µs since the Unix epoch at which credit was
--          measured, per = the period credit is counted in (ARGV[1] when
--          written). A missing key is a full bucket.
-- KEYS[2]  the key's pause (see pause.Suffix): the instant, µs, until which
--          every take is refused; missing when not paused.
-- ARGV[1]  now, µs, from the client's clock; "" for the server's TIME.
-- Then, bucket after bucket:
--   per    credit per token = the refill period in µs (integer).
--   count  credit added per µs = tokens per period (integer).
--   cap    credit of a full bucket = burst * per.
--   held   an instant, µs, until which the caller knows the bucket is not
--          full (it saw tokens taken), so its key exists; 0: none known.
--   m      the number of requests for the bucket (>= 1), then m
--          requests, two arguments each:
--     min  take nothing unless at least min tokens are there (>= 1).
--     max  take at most max tokens (min <= max <= burst).
--
-- The stored per is the period its credit is counted in. A quota
-- whose period differs (WithQuotas, or a new Rate.Per) keeps the bucket's
-- whole tokens (convert, in the prelude convert.lua). A hash of an earlier
-- version without per is counted in the current period.
--
-- Elapsed time is clamped at 0: if now is before ts, the bucket is read at
-- ts and ts is kept, so stored time never moves backwards. A rejection
-- (fewer than min tokens) takes nothing, and a batch in which nothing is
-- taken writes nothing, so that rejections neither take tokens nor move
-- the refill timeline. After taking, the key expires when the bucket
-- would be full again (rounded up to the ms): a missing key reads full.
--
-- A lost bucket: a key missing before held, while not paused, was lost
-- (FLUSHALL, a restart without its data, eviction): reading it full would
-- give a second burst. It starts empty at now instead, written so that
-- every process sees it.
--
-- Returns two integers per request, in order (bucket after bucket; then
-- the places of the buckets that failed, if any: see grouped.lua; then
-- now, the instant of the decisions, µs): granted = whole tokens
-- taken (0 or min..max); credit = what is left after taking, or what is
-- there when nothing was taken. The caller derives remaining tokens and
-- waits from credit with integer arithmetic. While the key is paused,
-- every request gets {-left, credit}, left = the µs until the pause ends
-- (>= 1), and nothing is written.

local now = clock(ARGV[1]) -- convert.lua

-- The pauses of every bucket, in one call.
local pauses
do
	local names = {}
	for k = 2, #KEYS, 2 do
		names[#names + 1] = KEYS[k]
	end
	pauses = redis.call("MGET", unpack(names))
end

local out = {}

-- take decides the requests of the bucket whose keys start after KEYS[s]
-- and whose ARGV start at a; g is its place among the buckets (from 1).
local function take(s, a, g)
	local key = KEYS[s + 1]
	local per = tonumber(ARGV[a])
	local count = tonumber(ARGV[a + 1])
	local cap = tonumber(ARGV[a + 2])
	local held = tonumber(ARGV[a + 3])
	local first, last = a + 5, a + 4 + 2 * tonumber(ARGV[a + 4])

	local credit, ts, missing = refill(key, per, count, cap, now) -- convert.lua

	-- Paused (Pause): take nothing, write nothing.
	local pausedUntil = tonumber(pauses[g])
	local paused = pausedUntil and pausedUntil > now
	local lost = not paused and held > now and missing
	if lost then
		credit, ts = 0, now
	end
	if paused then
		for _ = first, last, 2 do
			out[#out + 1] = now - pausedUntil
			out[#out + 1] = credit
		end
		return
	end

	local taken = false
	for i = first, last, 2 do
		local want = tonumber(ARGV[i])
		local got = 0
		if credit >= want * per then
			local max = tonumber(ARGV[i + 1])
			got = math.floor(credit / per)
			if got * per > credit then
				got = got - 1
			end
			if got > max then
				got = max
			end
			credit = credit - got * per
			taken = true
		end
		out[#out + 1] = got
		out[#out + 1] = credit
	end
	if not taken and not lost then
		return
	end
	-- Time to full, µs then ms, both rounded up: ceil(ceil(a/b)/c) = ceil(a/(b*c)).
	local d = count * 1000
	local ttl = math.floor((cap - credit) / d)
	if ttl * d < cap - credit then
		ttl = ttl + 1
	end
	store(key, credit, ts, per, ttl) -- convert.lua
end

-- The buckets one after another (eachKey: internal/redisscript/grouped.lua):
-- ARGV from 2, five header arguments per bucket, two per request, two
-- integers per reply; then now.
local reply = eachKey(out, 2, 2, 5, 2, 2, take)
reply[#reply + 1] = now
return reply
