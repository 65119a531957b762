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
