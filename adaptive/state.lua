-- state.lua: the key's state (see rejected.lua) and Redis's instant.
-- KEYS[1]  the key's state.
-- ARGV[1..3]  limit, estimate, decreased: written back when the state is
--          missing (lost) and the caller knew it ("" when not).
-- ARGV[4]  keep: how long the state lives, ms.
-- Returns {limit in thousandths of a call, estimate, decreased, now};
-- limit -1 when there is none.
local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
local s = redis.call("HMGET", KEYS[1], "limit", "estimate", "decreased")
if not s[1] then
	if ARGV[1] == "" then
		return {-1, 0, 0, now}
	end
	redis.call("HSET", KEYS[1], "limit", ARGV[1], "estimate", ARGV[2], "decreased", ARGV[3])
	redis.call("PEXPIRE", KEYS[1], ARGV[4])
	return {math.floor(tonumber(ARGV[1]) * 1000 + 0.5), tonumber(ARGV[2]), tonumber(ARGV[3]), now}
end
return {math.floor(tonumber(s[1]) * 1000 + 0.5), tonumber(s[2]) or 0, tonumber(s[3]) or 0, now}
