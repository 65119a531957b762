-- reset.lua: forget one key of a token bucket (Reset), sent after
-- convert.lua.
--
-- KEYS[1]  the bucket (see bucket.lua).
-- KEYS[2]  the key's ids set (see bucket_id.lua).
-- KEYS[3]  the key's pause (see bucket.lua).
-- ARGV[1]  per: credit per token = the refill period in µs.
-- ARGV[2]  cap: credit of a full bucket.
-- ARGV[3]  optional: now, µs, from the client's clock. Absent: the
--          server's TIME.
--
-- A bucket that existed is not left gone: a process that took tokens from
-- it knows it lives until its expiry, and would take it gone for a lost
-- one and start it empty (see bucket.lua). It is stored full until that
-- expiry instead, as giveBack does (convert.lua).
--
-- Returns the number of keys deleted (0 for an unknown key).
local keep = redis.call("PTTL", KEYS[1]) -- ms; < 0: missing, or no expiry
local deleted = redis.call("DEL", KEYS[1], KEYS[2], KEYS[3])
if keep > 0 then
	store(KEYS[1], tonumber(ARGV[2]), clock(ARGV[3]), tonumber(ARGV[1]), keep) -- convert.lua
end
return deleted
