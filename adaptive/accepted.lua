-- accepted.lua: one call the partner accepted, for the estimate of its
-- quota (see rejected.lua).
-- KEYS[1]  the key's accepted calls: a sorted set of members scored by
--          their instant, µs (Redis TIME).
-- ARGV[1]  per: the window, µs.
-- ARGV[2]  member: unique to the call.
local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
local per = tonumber(ARGV[1])
redis.call("ZADD", KEYS[1], now, ARGV[2])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - per)
redis.call("PEXPIRE", KEYS[1], math.ceil(2 * per / 1000))
return now
