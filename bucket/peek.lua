-- peek.lua: read one token bucket at now, writing nothing (Peek).
--
-- KEYS[1]  the bucket's hash {tokens, ts, per} (see bucket.lua). A
--          missing key is a full bucket.
-- KEYS[2]  the key's pause (see bucket.lua).
-- ARGV[1]  per: credit per token = the refill period in µs (integer).
-- ARGV[2]  count: credit added per µs = tokens per period (integer).
-- ARGV[3]  cap: credit of a full bucket = burst * per.
-- ARGV[4]  optional: now, µs, from the client's clock. Absent: now is the
--          server's TIME.
--
-- The credit is refilled and converted exactly as bucket.lua does before
-- it decides; nothing is written and no expiry is touched.
--
-- Returns {credit at now (negative with a debt of reservations), µs left
-- of the key's pause (0: not paused)}.

local key = KEYS[1]
local per = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])

local now
if ARGV[4] then
	now = tonumber(ARGV[4])
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end

local left = 0
local pausedUntil = tonumber(redis.call("GET", KEYS[2]))
if pausedUntil and pausedUntil > now then
	left = pausedUntil - now
end

local st = redis.call("HMGET", key, "tokens", "ts", "per")
local credit = tonumber(st[1])
local ts = tonumber(st[2])
if credit == nil or ts == nil then
	return {cap, left}
end
credit = convert(credit, tonumber(st[3]), per, cap) -- convert.lua
if now > ts then
	credit = credit + (now - ts) * count
end
if credit > cap then
	credit = cap
end
return {credit, left}
