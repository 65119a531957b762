-- slots.lua: one call on the in-flight slots of a key, atomically.
--
-- KEYS[1]  the key's sorted set: member = an id holding a slot (opaque
--          bytes, as the caller gave it), score = the end of its lease in
--          microseconds since the Unix epoch.
-- KEYS[2]  only with ARGV[5]: the key's clock floor, a string holding the
--          latest now (µs) a call on the key has used.
-- ARGV[1]  mode: "acquire", "renew" or "release".
-- ARGV[2]  the id.
-- ARGV[3]  lease, µs (integer >= 1, checked by the caller; release
--          ignores it).
-- ARGV[4]  limit: the most ids holding a slot at once (integer >= 1;
--          only acquire reads it).
-- ARGV[5]  optional: now, µs, from the client's clock. It is clamped to
--          KEYS[2] so that stored time never moves backwards, and KEYS[2]
--          is set to it. Absent: now is the server's TIME.
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
-- Returns {result, holders, first_us, last_us}: result = 1 if admitted
-- (acquire), or if the id held a slot (renew, release), else 0. For
-- acquire: holders = ids holding a slot after the call; first_us and
-- last_us = the earliest and the latest lease end - now (first_us only
-- for a rejection, else 0). Renew and release return 0 for the three.

local key = KEYS[1]
local mode = ARGV[1]
local id = ARGV[2]
local clocked = ARGV[5]
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
end

local result = 0
local holders = 0
if mode == "release" then
	result = redis.call("ZREM", key, id)
else
	local held = redis.call("ZSCORE", key, id)
	if mode == "acquire" then
		holders = redis.call("ZCARD", key)
		if not held and holders < tonumber(ARGV[4]) then
			held = true
			holders = holders + 1
		end
	end
	if held then
		redis.call("ZADD", key, now + tonumber(ARGV[3]), id)
		result = 1
	end
end

if mode ~= "acquire" and result == 0 and not clocked then
	return {0, 0, 0, 0}
end
local top = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2]
if not top then
	if clocked then
		redis.call("DEL", KEYS[2])
	end
	return {result, 0, 0, 0}
end
local last = tonumber(top)
if clocked then
	local ttl = math.ceil((last - now) / 1000) + 1
	redis.call("PEXPIRE", key, ttl)
	redis.call("SET", KEYS[2], now, "PX", ttl)
elseif result == 1 then
	redis.call("PEXPIREAT", key, math.ceil(last / 1000))
end
if mode ~= "acquire" then
	return {result, 0, 0, 0}
end
if result == 1 then
	return {1, holders, 0, last - now}
end
local first = tonumber(redis.call("ZRANGE", key, 0, 0, "WITHSCORES")[2])
return {0, holders, first - now, last - now}
