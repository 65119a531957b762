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
	if credit and ts and credit <= maxExact and credit >= -maxExact and credit % 1 == 0 and ts >= 0 and ts <= maxExact and ts % 1 == 0 and (per == nil or (per >= 1 and per <= maxExact and per % 1 == 0)) then
		return credit, ts, per
	end
	error({err = "WRONGTYPE the key holds a " .. form .. " that is not a token bucket"})
end

-- load returns the credit, ts and per stored at key, or nil when the key
-- is missing. v is the key's value when the caller has read it already
-- (MGET: false for a key missing or not a string); nil or false: read it. Earlier layouts are read as well, and the next store
-- replaces them: the text "credit ts per" and the hash {tokens, ts, per}
-- (per may be missing there, for the current period). A key of another
-- type, a hash without numeric tokens and ts, or a string of another form
-- is an error (WRONGTYPE): never read as a full bucket, and never
-- overwritten.
local function load(key, v)
	if not v then
		v = redis.pcall("GET", key)
	end
	if v and #v == 25 then -- an error reply is a table: # is 0
		local version, credit, ts, per = struct.unpack("<Bddd", v)
		if version == 1 then
			return bucketOf(credit, ts, per, "string")
		end
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
	if sp == per or sp == nil then
		if credit < cap - maxExact then
			return cap - maxExact
		end
		return credit
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

-- refill reads the bucket at key (its value v when read already: see
-- load) at now and returns its credit (counted
-- in per: convert), the instant it is read at, and whether the key was
-- missing. A missing bucket is full at now. Else the credit grows by count per µs
-- since the stored ts, up to cap; a now before ts counts as no time
-- passing, and the instant is ts (stored time never moves backwards). A
-- value of the current layout in per's period (most reads) is taken as
-- it is, without load, bucketOf and convert: three Lua calls fewer.
local function refill(key, per, count, cap, now, v)
	local version, credit, ts, sp
	if v and #v == 25 then
		version, credit, ts, sp = struct.unpack("<Bddd", v)
	end
	if not (version == 1 and sp == per and credit <= maxExact and credit >= cap - maxExact and credit % 1 == 0 and ts >= 0 and ts <= maxExact and ts % 1 == 0) then
		credit, ts, sp = load(key, v)
		if credit == nil or ts == nil then
			return cap, now, true
		end
		credit = convert(credit, sp, per, cap)
	end
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
