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
-- ARGV[4]  limit: the most ids holding a slot at once (integer >= 1).
-- ARGV[5]  optional: now, µs, from the client's clock. It is clamped to
--          KEYS[2] so that stored time never moves backwards, and KEYS[2]
--          is set to it. Absent: now is the server's TIME.
--
-- A lease ending at e is held during [.., e) and free at e: members with
-- score <= now are dropped first. Then:
--   acquire: an id already holding a slot gets its lease renewed to end at
--            now + lease and is admitted without taking another slot;
--            otherwise it is admitted, with a lease ending at now + lease,
--            if fewer than limit ids hold a slot, else rejected (nothing
--            added).
--   renew:   an id holding a slot gets its lease renewed to end at
--            now + lease; an id holding none is left out.
--   release: the id's slot, if any, is freed.
-- Afterwards the key expires when its last lease ends (rounded up to the
-- ms: PEXPIREAT on the server clock; with a client clock, PEXPIRE of the
-- time left plus 1 ms, since the two clocks may differ), or is deleted
-- with KEYS[2] if no lease is left. KEYS[2] expires with KEYS[1].
--
-- Returns {result, holders, first_us, last_us}: result = 1 if admitted
-- (acquire), or if the id held a slot (renew, release), else 0; holders =
-- ids holding a slot after the call; first_us and last_us = the earliest
-- and the latest lease end - now (first_us only for a rejected acquire,
-- else 0; both 0 when no slot is held).

local key = KEYS[1]
local mode = ARGV[1]
local id = ARGV[2]
local now
if ARGV[5] then
	now = tonumber(ARGV[5])
	local floor = tonumber(redis.call("GET", KEYS[2]))
	if floor and floor > now then
		now = floor
	end
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end

redis.call("ZREMRANGEBYSCORE", key, "-inf", now)

local holders = redis.call("ZCARD", key)
local result = 0
if mode == "release" then
	result = redis.call("ZREM", key, id)
	holders = holders - result
else
	local held = redis.call("ZSCORE", key, id)
	if held or (mode == "acquire" and holders < tonumber(ARGV[4])) then
		redis.call("ZADD", key, now + tonumber(ARGV[3]), id)
		result = 1
		if not held then
			holders = holders + 1
		end
	end
end

if holders == 0 then
	redis.call("DEL", key)
	if ARGV[5] then
		redis.call("DEL", KEYS[2])
	end
	return {result, 0, 0, 0}
end

local last = tonumber(redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2])
if ARGV[5] then
	local ttl = math.ceil((last - now) / 1000) + 1
	redis.call("PEXPIRE", key, ttl)
	redis.call("SET", KEYS[2], now, "PX", ttl)
else
	redis.call("PEXPIREAT", key, math.ceil(last / 1000))
end

local first = 0
if result == 0 and mode == "acquire" then
	first = tonumber(redis.call("ZRANGE", key, 0, 0, "WITHSCORES")[2]) - now
end
return {result, holders, first, last - now}
