-- pause.lua: pause one window key (internal/pause/pause.lua's rules: the
-- pause extends, never shortens, and expires when it ends) and move its
-- reservations ahead later by as much as the pause grew: none of their
-- slots can be claimed while it holds, and moving them all keeps their
-- order and spacing, so every window still holds at most the limit and
-- each request keeps its place in the schedule.
--
-- KEYS[1]  the key's pause (pause.Suffix).
-- KEYS[2]  the key's sorted set (see window.lua).
-- KEYS[3]  the key's schedule (see window.lua): its newest reservation
--          moves with them, and its slot-search hint is cleared.
-- ARGV[1]  the pause, µs (integer, 1 .. 2^52).
-- ARGV[2]  now, µs, from the client's clock; "" for the server's TIME
--          rounded up to the next µs.
--
-- Returns the µs the key stays paused after now (the longer pause's).
local d = tonumber(ARGV[1])
local now
if ARGV[2] ~= "" then
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
local grew = finish - math.max(cur or now, now)
local raw = redis.call("ZRANGE", KEYS[2], "(" .. string.format("%d", now), "+inf", "BYSCORE", "WITHSCORES")
local moved = {}
for i = 1, #raw, 2 do
	if string.byte(raw[i]) == 82 then -- "R": a reserved unit
		moved[#moved + 1] = string.format("%d", tonumber(raw[i + 1]) + grew)
		moved[#moved + 1] = raw[i]
	end
end
if #moved > 0 then
	for i = 1, #moved, 1000 do
		redis.call("ZADD", KEYS[2], "XX", unpack(moved, i, math.min(i + 999, #moved)))
	end
	local extra = math.ceil(grew / 1000)
	for _, k in ipairs({ KEYS[2], KEYS[3] }) do
		local ttl = redis.call("PTTL", k)
		if ttl > 0 then
			redis.call("PEXPIRE", k, ttl + extra)
		end
	end
	local newest = string.match(redis.call("GET", KEYS[3]) or "", "^(%d+) ")
	if newest then
		redis.call("SET", KEYS[3], string.format("%d 0 0 0 0", tonumber(newest) + grew), "KEEPTTL")
	end
end
return d
