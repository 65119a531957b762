-- slots.lua: one call on the in-flight slots of a key, atomically.
--
-- KEYS[1]  the key's sorted set: member = an id holding a slot (opaque
--          bytes, as the caller gave it), score = the end of its lease in
--          microseconds since the Unix epoch.
-- KEYS[2]  only with a client clock (ARGV[5] not empty): the key's clock
--          floor, a string holding the latest now (µs) a call on the key
--          has used.
-- ARGV[1]  mode: "acquire", "renew" or "release".
-- ARGV[2]  the id.
-- ARGV[3]  lease, µs (integer >= 1, checked by the caller; release
--          ignores it).
-- ARGV[4]  limit: the most ids holding a slot at once (integer >= 1;
--          only acquire reads it).
-- ARGV[5]  now, µs, from the client's clock, clamped to KEYS[2] so that
--          stored time never moves backwards, and KEYS[2] is set to it;
--          "" (or absent): now is the server's TIME.
-- ARGV[6]  held (optional): an instant, µs, until which the caller knows
--          the set exists (a lease it was given ends then; 0: none known).
--          The set keeps a member "\0alive" scored by the latest lease end
--          it gave (not a holder), so that releases never delete it before
--          then. A set missing before held, on acquire or renew, was lost
--          (FLUSHALL, a restart without its data): its slots may all be
--          held, unseen, for up to a lease, so every slot is taken by a
--          placeholder ("\0lost:" .. i) until now + lease, and no new slot
--          is given until then.
--
-- A lease ending at e is held until e and free at e: acquire and renew
-- first drop the members with score <= now. Then:
--   acquire: an id already holding a slot gets its lease renewed to end at
--            now + lease and is admitted without taking another slot;
--            otherwise it is admitted, with a lease ending at now + lease,
--            if fewer than limit ids hold a slot, else rejected (nothing
--            added).
--   renew:   an id holding a slot gets its lease renewed to end at
--            now + lease; an id holding none changes nothing.
--   release: the id's slot, if any, is freed.
-- Whenever the set changes, the key is set to expire when its last lease
-- ends (PEXPIREAT, rounded up to the ms, on the server clock; with a
-- client clock, PEXPIRE of the time left rounded up plus 1 ms, since the
-- two clocks may differ, and KEYS[2] expires with it). Redis deletes a
-- sorted set left empty; KEYS[2] is then deleted too. With the server
-- clock, release needs no now: a key left holding only ended leases gets
-- an expiry in the past, which deletes it.
--
-- Returns {result, holders, first_us, last_us, now}: result = 1 if admitted
-- (acquire), or if the id held a slot (renew, release), else 0. For
-- acquire: holders = ids holding a slot after the call; first_us and
-- last_us = the earliest and the latest lease end - now (first_us only
-- for a rejection, else 0). Renew and release return 0 for the three.
-- now = the call's instant (0 for a release on the server's clock).

local key = KEYS[1]
local mode = ARGV[1]
local id = ARGV[2]
local clocked = ARGV[5] and ARGV[5] ~= ""
local now
if clocked then
	now = tonumber(ARGV[5])
	local floor = tonumber(redis.call("GET", KEYS[2]))
	if floor and floor > now then
		now = floor
	end
elseif mode ~= "release" then
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end
if now then
	redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
	if mode ~= "release" and tonumber(ARGV[6] or "0") > now and redis.call("EXISTS", key) == 0 then
		local untilUS = now + tonumber(ARGV[3])
		for i = 1, tonumber(ARGV[4]) do
			redis.call("ZADD", key, untilUS, "\0lost:" .. i)
		end
		redis.call("ZADD", key, "GT", untilUS, "\0alive")
		if not clocked then
			redis.call("PEXPIREAT", key, math.ceil(untilUS / 1000))
		end
	end
end

local result = 0
local holders = 0
if mode == "release" then
	result = redis.call("ZREM", key, id)
else
	local held = redis.call("ZSCORE", key, id)
	if mode == "acquire" then
		holders = redis.call("ZCARD", key)
		if redis.call("ZSCORE", key, "\0alive") then
			holders = holders - 1
		end
		if not held and holders < tonumber(ARGV[4]) then
			held = true
			holders = holders + 1
		end
	end
	if held then
		redis.call("ZADD", key, now + tonumber(ARGV[3]), id)
		redis.call("ZADD", key, "GT", now + tonumber(ARGV[3]), "\0alive")
		result = 1
	end
end

if mode ~= "acquire" and result == 0 and not clocked then
	return {0, 0, 0, 0, now or 0}
end
-- The set lives until its highest score (its "\0alive" member's, or a
-- lease's); last is the latest lease end of a holder.
local tail = redis.call("ZRANGE", key, -2, -1, "WITHSCORES")
if #tail == 0 then
	if clocked then
		redis.call("DEL", KEYS[2])
	end
	return {result, 0, 0, 0, now or 0}
end
local expireAt = tonumber(tail[#tail])
local last = now or expireAt
for i = #tail - 1, 1, -2 do
	if tail[i] ~= "\0alive" then
		last = tonumber(tail[i + 1])
		break
	end
end
if clocked then
	local ttl = math.ceil((expireAt - now) / 1000) + 1
	redis.call("PEXPIRE", key, ttl)
	redis.call("SET", KEYS[2], now, "PX", ttl)
elseif result == 1 then
	redis.call("PEXPIREAT", key, math.ceil(expireAt / 1000))
end
if mode ~= "acquire" then
	return {result, 0, 0, 0, now or 0}
end
if result == 1 then
	return {1, holders, 0, last - now, now}
end
local first = tonumber(redis.call("ZRANGE", key, 0, 0, "WITHSCORES")[2])
return {0, holders, first - now, last - now, now}
