-- convert.lua: the prelude of every bucket script that reads a bucket's
-- hash (Go prepends it to bucket.lua, bucket_id.lua, giveback.lua,
-- peek.lua and refund.lua): convert, clock, refill and giveBack.
--
-- convert returns credit, counted in the period sp (µs per token, the
-- hash's per field; nil: the current one), counted in per instead: the
-- same credit when the period is the same; otherwise its whole tokens
-- (floor, so a partial debt counts as a whole token) within
-- [-floor((2^53 - cap) / per), cap / per] tokens, times per. A quota whose
-- period changed (WithQuotas, or a new Rate.Per) so keeps the bucket's
-- whole tokens. params.convert in quota.go is the twin.
local function convert(credit, sp, per, cap)
	if sp == nil or sp == per then
		return credit
	end
	local t = math.floor(credit / sp)
	local lo = -math.floor((9007199254740992 - cap) / per)
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

-- refill reads the bucket in key's hash at now and returns its credit
-- (counted in per: convert) and the instant it is read at. A missing or
-- partial hash is a full bucket at now. Else the credit grows by count per
-- µs since the hash's ts, up to cap; a now before ts counts as no time
-- passing, and the instant is ts (stored time never moves backwards).
local function refill(key, per, count, cap, now)
	local st = redis.call("HMGET", key, "tokens", "ts", "per")
	local credit, ts = tonumber(st[1]), tonumber(st[2])
	if credit == nil or ts == nil then
		return cap, now
	end
	credit = convert(credit, tonumber(st[3]), per, cap)
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

-- giveBack returns n tokens to the bucket in key's hash (its credit
-- counted in per: convert), up to cap, without moving its ts, and returns
-- the credit stored after (cap when full). A missing or partial hash is a
-- full bucket and stays missing. The hash's expiry moves to the instant
-- the bucket is full again, at ts + ceil((cap - credit) / count); it is
-- deleted if that is not after now (or ts, when now is before it).
local function giveBack(key, per, count, cap, n, now)
	local st = redis.call("HMGET", key, "tokens", "ts", "per")
	local credit, ts = tonumber(st[1]), tonumber(st[2])
	if credit == nil or ts == nil then
		return cap
	end
	credit = convert(credit, tonumber(st[3]), per, cap) + n * per
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
		redis.call("DEL", key)
		return cap
	end
	redis.call("HSET", key, "tokens", credit, "per", per)
	local ttl = math.floor(left / 1000)
	if ttl * 1000 < left then
		ttl = ttl + 1
	end
	redis.call("PEXPIRE", key, ttl)
	return credit
end
