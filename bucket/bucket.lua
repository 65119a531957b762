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
-- KEYS holds the k buckets, then their k pauses, in the same order:
-- KEYS[g]      the g-th bucket: credit, ts and per, packed (see convert.lua),
--              credit at ts (an integer), ts = µs since the Unix epoch at
--              which credit was measured, per = the period credit is
--              counted in (its quota's per when written). A missing key is
--              a full bucket.
-- KEYS[k + g]  its pause (see pause.Suffix): the instant, µs, until which
--              every take is refused; missing when not paused.
-- ARGV[1]  now, µs, from the client's clock; "" for the server's TIME.
-- ARGV[2]  nq, the number of quotas (>= 1; "-1": the compact form, see
--          below), then nq quotas, three arguments each (sent once
--          however many buckets share one):
--   per    credit per token = the refill period in µs (integer).
--   count  credit added per µs = tokens per period (integer).
--   cap    credit of a full bucket = burst * per.
-- Then, bucket after bucket:
--   q      (only when nq > 1) the bucket's quota, from 1.
--   held   an instant, µs, until which the caller knows the bucket is not
--          full (it saw tokens taken), so its key exists; 0: none known.
--   m      the number of requests for the bucket (>= 1), then m requests,
--          each take at least min tokens (nothing unless min are there,
--          min >= 1) and at most max (min <= max <= burst), sent as:
--     n         min = max = n (AllowN), one argument; or
--     -min max  min < max (a lease), two arguments.
--
-- The arguments are few and short, and each bucket is read by one MGET
-- for the whole call, because Redis's work per bucket is mostly what is
-- done for every argument and every command (see BenchmarkScriptCPU).
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
-- the places of the buckets that failed, if any: see below; then
-- now, the instant of the decisions, µs): granted = whole tokens
-- taken (0 or min..max); credit = what is left after taking, or what is
-- there when nothing was taken. The caller derives remaining tokens and
-- waits from credit with integer arithmetic. While the key is paused,
-- every request gets {-left, credit}, left = the µs until the pause ends
-- (>= 1), and nothing is written.

-- The script is bucket_head.lua, convert.lua, then this file: the head
-- has decided a lone AllowN it could, or read the instant and the keys.
local now = headNow or clock(ARGV[1]) -- bucket_head.lua, convert.lua

-- The compact form (nq "-1"): one quota, and each bucket one request of
-- one token, sent as its held alone (ARGV[5 + g] for the g-th bucket).
local compact = ARGV[2] == "-1"
if compact then
	ARGV[2] = "1"
end

-- The quotas, once per call.
local nq = ARGV[2] + 0
local pers, counts, caps = {}, {}, {}
for q = 1, nq do
	local b = 3 * q
	pers[q], counts[q], caps[q] = ARGV[b] + 0, ARGV[b + 1] + 0, ARGV[b + 2] + 0
end

-- Every bucket and every pause, in one call. MGET reads a key that is not
-- a string as missing: load reads a missing bucket again, by itself.
local k = #KEYS / 2
local vals = headVals or redis.call("MGET", unpack(KEYS))

local out, n = {}, 0

-- skip returns the place after the arguments of the request at ARGV[a]:
-- one (n) or two (-min max); none in the compact form (one is 1).
local function skip(a, one)
	if one then
		return a
	end
	if ARGV[a] + 0 < 0 then
		return a + 2
	end
	return a + 1
end

-- take decides the m requests, from ARGV[a] (or one request of one
-- token when one is 1: the compact form), of the g-th bucket, under the
-- q-th quota, held (the argument) until held; it returns the place of the
-- next bucket's arguments.
local function take(g, a, m, q, held, one)
	local key = KEYS[g]
	local per, count, cap = pers[q], counts[q], caps[q]
	local credit, ts, missing = refill(key, per, count, cap, now, vals[g]) -- convert.lua

	-- Paused (Pause): take nothing, write nothing.
	local pausedUntil = vals[k + g]
	if pausedUntil then
		pausedUntil = tonumber(pausedUntil)
		if pausedUntil and pausedUntil > now then
			for _ = 1, m do
				a = skip(a, one)
				out[n + 1] = now - pausedUntil
				out[n + 2] = credit
				n = n + 2
			end
			return a
		end
	end
	local lost = missing and held ~= "0" and held + 0 > now
	if lost then
		credit, ts = 0, now
	end

	local taken = false
	for _ = 1, m do
		local want = one or ARGV[a]
		want = want == "1" and 1 or want + 0 -- (a compare costs less than the conversion)
		local max = want
		a = a + 1
		if want < 0 then
			want, max = -want, ARGV[a] + 0
			a = a + 1
		end
		local got = 0
		if credit >= want * per then
			got = credit / per
			got = got - got % 1 -- floor
			if got * per > credit then
				got = got - 1
			end
			if got > max then
				got = max
			end
			credit = credit - got * per
			taken = true
		end
		out[n + 1] = got
		out[n + 2] = credit
		n = n + 2
	end
	if not taken and not lost then
		return a
	end
	-- Time to full, µs then ms, both rounded up: ceil(ceil(a/b)/c) = ceil(a/(b*c)).
	local d = count * 1000
	local ttl = (cap - credit) / d
	ttl = ttl - ttl % 1 -- floor
	if ttl * d < cap - credit then
		ttl = ttl + 1
	end
	store(key, credit, ts, per, ttl) -- convert.lua
	return a
end

-- The buckets one after another. With several, a bucket whose commands
-- fail (a key of another type under the prefix) fails alone: its replies
-- are zeros and its place is listed after every reply, for the caller to
-- send it again by itself (and get the error). take fails at the bucket's
-- first command, before anything of it is written. With one bucket, an
-- error fails the call.
local a = 3 + 3 * nq
local failed
for g = 1, k do
	local q, held, m, one = 1
	if compact then
		held, m, one = ARGV[5 + g], 1, 1
	else
		if nq > 1 then
			q = ARGV[a] + 0
			a = a + 1
		end
		held, m = ARGV[a], ARGV[a + 1]
		m = m == "1" and 1 or m + 0
		a = a + 2
	end
	if k == 1 then
		a = take(g, a, m, q, held, one)
	else
		local mark = n
		local ok, next = pcall(take, g, a, m, q, held, one)
		if ok then
			a = next
		else
			for i = mark + 1, n do
				out[i] = nil
			end
			n = mark
			for _ = 1, m do
				a = skip(a, one)
				out[n + 1], out[n + 2] = 0, 0
				n = n + 2
			end
			failed = failed or {}
			failed[#failed + 1] = g
		end
	end
end
if failed then
	for _, g in ipairs(failed) do
		n = n + 1
		out[n] = g
	end
end
out[n + 1] = now
return out
