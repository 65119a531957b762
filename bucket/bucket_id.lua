-- bucket_id.lua: one token-bucket decision for a request with an id
-- (AllowID), atomically: reservations take tokens ahead of time, as
-- golang.org/x/time/rate's ReserveN does, and ids make admission
-- idempotent. The twin of Local.AllowID (local_ids.go); the credit
-- arithmetic and the stored bucket are bucket.lua's, except that credit
-- may be negative: a debt of reservations.
--
-- KEYS[1]  the bucket (see bucket.lua). A missing key is a full bucket.
-- KEYS[2]  the key's ids: a sorted set beside the bucket, in the same slot.
--          Members "A:"..id (admitted, scored by the admission instant)
--          and "R:"..id (reserved, scored by the slot), µs since the Unix
--          epoch.
-- KEYS[3]  the key's pause (see pause.Suffix): the instant, µs, until which
--          every decision is a rejection; missing when not paused.
-- ARGV[1]  per: credit per token = the refill period in µs (integer).
-- ARGV[2]  count: credit added per µs = tokens per period (integer).
-- ARGV[3]  cap: credit of a full bucket = burst * per.
-- ARGV[4]  n: the cost (1 <= n <= burst, checked by the caller).
-- ARGV[5]  id: the request's identity, opaque bytes.
-- ARGV[6]  horizon: reserve only a slot at most this far ahead, µs (>= 0).
-- ARGV[7]  maxdebt: credit never goes below -maxdebt (cap + maxdebt <=
--          2^53, so every sum here is exact).
-- ARGV[8]  memory: how long an id is remembered after its admission or
--          slot, µs: the time from empty to full, ceil(cap / count).
-- ARGV[9]  now, µs, from the client's clock; "" for the server's TIME.
-- ARGV[10] held: an instant, µs, until which the caller knows the bucket is
--          short of full, so that its key exists (0: none known). A key
--          missing before then, while not paused, was lost: the bucket
--          starts empty at now, written (see bucket.lua).
-- ARGV[11] with the server's TIME: an instant, µs, after which the script
--          applies nothing and returns {-1, now}: its caller has given up
--          (Redis was slow or stalled), and an id admitted that nobody
--          knows of would let its redelivery run free, later. "" or
--          absent: none.
-- ARGV[12] after (AllowIDAfter): the slot lies no earlier than now + after
--          µs; "0" or absent: AllowID. See below.
--
-- A stored per other than ARGV[1] is converted (convert.lua).
--
-- A clock behind the bucket's ts counts as no time passing: now is ts.
-- Ids at or before now - memory are forgotten first. Then: an admitted id
-- is admitted again, charged nothing; a reserved id is rejected with the
-- time to its slot while the slot is ahead, and admitted on its
-- reservation (its tokens were taken when it was made) once the slot has
-- come, which records it as admitted at now. Otherwise, as bucket.lua:
-- admitted if n tokens are there, taking them; else, if taking them now
-- leaves a debt that the refill repays within the horizon (wait =
-- ceil((n * per - credit) / count) µs), they are taken and the id is
-- reserved at now + wait; else nothing is written. After a write the bucket
-- expires when the bucket would be full again, counting the debt, and the
-- ids set when its newest entry is forgotten (PEXPIRE GT: Redis 7.0 or
-- newer). With a client clock that moves backwards, after the bucket has
-- expired, the set may expire before an older id is forgotten.
--
-- With after > 0 (the twin of reserveAfter in local_ids.go): an admitted
-- id is admitted again; a reserved id keeps a slot at or after now +
-- after, and gives back its tokens otherwise (as refund.lua) to be decided
-- anew; nothing is admitted now. The tokens are taken now and the later
-- of the request's own slot and now + after reserved, a slot later than
-- its own only while the bucket without the request would not refill to
-- its cap by then: else nothing is written and wait_us = after.
--
-- Returns {allowed (0|1), credit, wait_us, reserved (0|1), paused (0|1),
-- now}, reserved 1 with allowed 1 for an id admitted before: credit = what is left after the decision (or there, when nothing
-- was taken; negative with a debt); wait_us = 0 when admitted, else the
-- time to the slot (reserved) or until the request would fit (not
-- reserved); now = the decision's instant. While the key is paused:
-- {0, credit, left, 0, 1, now}, left = the µs until the pause ends,
-- writing nothing (a paused key admits and reserves nothing).

local key = KEYS[1]
local ids = KEYS[2]
local per = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local id = ARGV[5]
local horizon = tonumber(ARGV[6])
local maxdebt = tonumber(ARGV[7])
local memory = tonumber(ARGV[8])
local held = tonumber(ARGV[10])
local after = tonumber(ARGV[12] or "0") or 0

local now0 = clock(ARGV[9]) -- convert.lua
if ARGV[11] and ARGV[11] ~= "" and now0 > tonumber(ARGV[11]) then
	return {-1, now0}
end
local credit, ts, missing = refill(key, per, count, cap, now0)
local now = ts

-- Paused (Pause): reject, write nothing.
local pausedUntil = tonumber(redis.call("GET", KEYS[3]))
if pausedUntil and pausedUntil > now then
	return {0, credit, pausedUntil - now, 0, 1, now}
end

-- ceil(a / b) for integers 0 <= a <= 2^53, b >= 1 (the float quotient's
-- floor is exact in that range).
local function ceildiv(a, b)
	local q = math.floor(a / b)
	if q * b < a then
		q = q + 1
	end
	return q
end

redis.call("ZREMRANGEBYSCORE", ids, "-inf", now - memory)

-- remember records member at score and keeps the ids set until its newest
-- entry is forgotten. newest: no entry is later than score, which holds
-- for a fresh admission (no debt left: every slot has passed) and for a
-- reservation (slots come in order, after now); else the set exists, with
-- an expiry, and GT keeps a later one.
local function remember(member, score, newest)
	redis.call("ZADD", ids, score, member)
	local ttl = ceildiv(score - now + memory, 1000)
	if newest then
		redis.call("PEXPIRE", ids, ttl)
	elseif redis.call("PEXPIRE", ids, ttl, "NX") == 0 then -- a new set has none
		redis.call("PEXPIRE", ids, ttl, "GT")
	end
end

-- save writes the bucket with credit c, expiring when full again.
local function save(c)
	store(key, c, ts, per, ceildiv(cap - c, count * 1000)) -- convert.lua
end

if held > now and missing then
	-- Lost: empty, not full, for every process.
	credit = 0
	save(credit)
end

local need = n * per
local s = redis.call("ZMSCORE", ids, "A:" .. id, "R:" .. id)
if s[1] then
	return {1, credit, 0, 1, 0, now}
end
if s[2] then
	local slot = tonumber(s[2])
	if slot > now and slot >= now + after then
		return {0, credit, slot - now, 1, 0, now}
	end
	redis.call("ZREM", ids, "R:" .. id)
	if after == 0 then
		remember("A:" .. id, now, false)
		return {1, credit, 0, 0, 0, now}
	end
	credit = math.min(credit + need, cap) -- given back, decided anew
	if credit < cap then
		save(credit)
	else
		-- Full again: as giveBack (convert.lua), keeping the key's life.
		local keep = redis.call("PTTL", key)
		if keep > 0 then
			store(key, cap, ts, per, keep)
		else
			redis.call("DEL", key)
		end
	end
end

if after > 0 then
	local left = credit - need
	local wait = 0
	if left < 0 then
		wait = ceildiv(-left, count)
	end
	local slot = math.max(wait, after)
	if slot > wait and slot > math.floor((cap - credit) / count) then
		slot = after -- full by then: nothing taken
	elseif slot <= horizon and -left <= maxdebt then
		save(left)
		remember("R:" .. id, now + slot, false)
		return {0, left, slot, 1, 0, now}
	end
	return {0, credit, slot, 0, 0, now}
end

if credit >= need then
	credit = credit - need
	save(credit)
	remember("A:" .. id, now, true)
	return {1, credit, 0, 0, 0, now}
end

local debt = need - credit -- > 0: the credit missing after taking now
local wait = ceildiv(debt, count)
if wait <= horizon and debt <= maxdebt then
	save(-debt)
	remember("R:" .. id, now + wait, true)
	return {0, -debt, wait, 1, 0, now}
end
return {0, credit, wait, 0, 0, now}
