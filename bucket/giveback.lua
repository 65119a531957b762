-- giveback.lua: return unused tokens to one token bucket (see bucket.lua
-- for the credit arithmetic and the hash), without moving its refill
-- timeline.
--
-- KEYS[1]  the bucket's hash {tokens, ts}.
-- ARGV[1]  per: credit per token = the refill period in µs.
-- ARGV[2]  count: credit added per µs.
-- ARGV[3]  cap: credit of a full bucket.
-- ARGV[4]  n: tokens to give back (>= 1).
-- ARGV[5]  optional: now, µs, from the client's clock. Absent: the
--          server's TIME.
--
-- A stored per other than ARGV[1] is converted (convert.lua).
--
-- tokens grows by n * per, capped at cap; ts stays. A missing key is a
-- full bucket and stays missing. The key's expiry moves to the earlier
-- instant at which the bucket is now full (deleted if that is already
-- past).
--
-- Returns the credit stored at ts after the return (cap if full).

local key = KEYS[1]
local st = redis.call("HMGET", key, "tokens", "ts", "per")
local credit = tonumber(st[1])
local ts = tonumber(st[2])
local cap = tonumber(ARGV[3])
if credit == nil or ts == nil then
	return cap
end
local per = tonumber(ARGV[1])
if credit ~= nil then
	credit = convert(credit, tonumber(st[3]), per, cap) -- convert.lua
end
local count = tonumber(ARGV[2])
credit = credit + tonumber(ARGV[4]) * per
if credit > cap then
	credit = cap
end

local now = clock(ARGV[5]) -- convert.lua
if now < ts then
	now = ts
end

-- The bucket is full at ts + ceil((cap - credit) / count).
local full = math.floor((cap - credit) / count)
if full * count < cap - credit then
	full = full + 1
end
local left = ts + full - now
if left <= 0 then
	redis.call("DEL", key)
	return cap
end
redis.call("HSET", key, "tokens", credit, "per", per)
local ttl = math.floor(left / 1000)
if ttl * 1000 < left then
	ttl = ttl + 1
end
redis.call("PEXPIRE", key, ttl)
return credit
