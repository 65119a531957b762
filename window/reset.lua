-- reset.lua: forget one key of a window.
--
-- KEYS[1]  the key's sorted set.
-- KEYS[2]  the key's clock floor (see window.lua).
-- KEYS[3]  the key's schedule (see window.lua).
-- KEYS[4]  the key's pause (see window.lua).
-- ARGV[1]  "1": the server's clock (with a client clock the limiter does
--          not look for lost sets, and writes nothing below).
--
-- A process that saw a unit of the set admitted holds it until at most
-- the set's expiry, and would take the set gone for a lost one and pause
-- the key (see "Lost sets" in window.lua). So a set that existed leaves
-- its pause key holding the instant of the reset (the server's TIME, µs,
-- rounded up: an instant past, so no pause) until that expiry, and a
-- process whose held stands for an admission no later than it takes the
-- set gone for the reset, not a loss (see window.lua's suspect).
--
-- Returns the number of keys deleted (0 for an unknown key).
local expires = redis.call("PEXPIRETIME", KEYS[1]) -- ms; -2: missing, -1: no expiry
local deleted = redis.call("DEL", KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if expires > 0 and ARGV[1] == "1" then
	local t = redis.call("TIME")
	redis.call("SET", KEYS[4], string.format("%d", t[1] * 1000000 + t[2] + 1), "PXAT", expires)
end
return deleted
