-- reset.lua: forget one key of a window.
--
-- KEYS[1]  the key's sorted set.
-- KEYS[2]  the key's clock floor (see window.lua).
-- KEYS[3]  the key's schedule (see window.lua).
-- KEYS[4]  the key's pause (see window.lua).
--
-- A set that existed is not left gone: a process that saw one of its
-- units admitted holds it until at most the set's expiry, and would take
-- a set gone for a lost one and pause the key (see "Lost sets" in
-- window.lua). It is written anew with only the member "~r", scored
-- -2^53 (below every unit and marker: no decision counts it, and every
-- drop from -inf takes it), until the set's expiry.
--
-- Returns the number of keys deleted (0 for an unknown key).
local expires = redis.call("PEXPIRETIME", KEYS[1]) -- ms; -2: missing, -1: no expiry
local deleted = redis.call("DEL", KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if expires > 0 then
	redis.call("ZADD", KEYS[1], "-9007199254740992", "~r")
	redis.call("PEXPIREAT", KEYS[1], expires)
end
return deleted
