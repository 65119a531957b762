-- window.lua: one sliding-window-log decision, atomically.
--
-- KEYS[1]  the key's sorted set: member = one admitted unit (an opaque
--          identity chosen by the caller), score = its admission time in
--          microseconds since the Unix epoch.
-- ARGV[1]  window, µs (integer).
-- ARGV[2]  limit: the most units the window admits (integer >= 1).
-- ARGV[3]  key expiry after an admission, ms (the window rounded up).
-- ARGV[4]  n, the cost (1 <= n <= limit, checked by the caller).
-- ARGV[5]  member identity. n == 1 stores it as is; n > 1 stores
--          ARGV[5]..":1" .. ARGV[5]..":"..n.
-- ARGV[6]  optional: now, µs, from the client's clock. The script then
--          never moves time backwards: now is clamped to the newest score.
--          Absent: now is the server's TIME.
--
-- An admission at t counts during [t, t+window): members with score
-- <= now - window are dropped first, the rest counted. Only an admission
-- adds members and renews the expiry; a rejection adds nothing.
--
-- Returns {allowed (0|1), remaining, retry_after_us, reset_after_us}:
-- remaining = limit - counted units after the decision; retry_after_us =
-- 0 when admitted, else the k-th oldest counted score + window - now, with
-- k = count + n - limit; reset_after_us = newest score + window - now.

local key = KEYS[1]
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local now
if ARGV[6] then
	now = tonumber(ARGV[6])
	local newest = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2]
	if newest then
		newest = tonumber(newest)
		if newest > now then
			now = newest
		end
	end
else
	local t = redis.call("TIME")
	now = t[1] * 1000000 + t[2]
end

-- Drop what has left the window (scores <= now - window), then count.
local oldest = now - window
redis.call("ZREMRANGEBYSCORE", key, "-inf", oldest)
local count = redis.call("ZCARD", key)

if count + n <= limit then
	if n == 1 then
		redis.call("ZADD", key, now, ARGV[5])
	else
		-- Batches keep unpack() well inside Lua's stack limit.
		local args = {}
		local i = 1
		while i <= n do
			local j = 0
			while j < 500 and i <= n do
				args[2 * j + 1] = now
				args[2 * j + 2] = ARGV[5] .. ":" .. i
				j = j + 1
				i = i + 1
			end
			for m = 2 * j + 1, #args do
				args[m] = nil
			end
			redis.call("ZADD", key, unpack(args))
		end
	end
	redis.call("PEXPIRE", key, ARGV[3])
	return {1, limit - count - n, 0, window}
end

local k = count + n - limit
local kth = redis.call("ZRANGE", key, k - 1, k - 1, "WITHSCORES")[2]
local newest = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2]
return {0, limit - count, tonumber(kth) + window - now, tonumber(newest) + window - now}
