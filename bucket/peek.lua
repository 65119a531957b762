-- peek.lua: read one token bucket at now, writing nothing (Peek).
--
-- KEYS[1]  the bucket (see bucket.lua). A missing key is a full bucket.
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

local now = clock(ARGV[4]) -- convert.lua

local left = 0
local pausedUntil = tonumber(redis.call("GET", KEYS[2]))
if pausedUntil and pausedUntil > now then
	left = pausedUntil - now
end

local credit = refill(key, per, count, cap, now) -- convert.lua
return {credit, left}
