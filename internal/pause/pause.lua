-- pause.lua: pause one key of a limiter, extending and never shortening.
--
-- KEYS[1]  the key's pause: a string beside the key's data (same slot),
--          holding the instant the pause ends, µs since the Unix epoch.
-- KEYS[2]  optional: a window's sorted set, whose expiry markers (its
--          members scored below 0) are dropped: a lone decision of the
--          window reads the pause only when its set's marker is missing
--          (see window/window_head.lua).
-- ARGV[1]  the pause, µs (integer, 1 .. 2^52).
-- ARGV[2]  optional: now, µs, from the client's clock. Absent: now is the
--          server's TIME rounded up to the next µs.
--
-- The pause ends at now + ARGV[1], unless a pause already recorded ends
-- later: then nothing is written. The key expires (PX, real time) a
-- millisecond after the pause would end on the server's clock, so an ended
-- pause leaves nothing behind. The decision scripts read the key with one
-- GET and reject while its instant is after their now.
--
-- Returns the µs the key stays paused after now (the longer pause's).

if KEYS[2] then
	redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", "(0")
end
local d = tonumber(ARGV[1])
local now
if ARGV[2] then
	now = tonumber(ARGV[2])
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2] + 1
end
local finish = now + d
local cur = tonumber(redis.call("GET", KEYS[1]))
if cur and cur >= finish then
	return cur - now
end
redis.call("SET", KEYS[1], string.format("%d", finish), "PX", math.ceil(d / 1000) + 1)
return d
