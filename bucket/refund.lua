-- refund.lua: take back what one id holds in a token bucket
-- (Redis.Refund): the tokens that AllowID took for its admission or its
-- reservation, given back without moving the refill timeline (as
-- giveback.lua), and the id forgotten, in one step, so that refunding
-- twice gives back once.
--
-- KEYS[1]  the bucket (see bucket.lua).
-- KEYS[2]  the key's ids (see bucket_id.lua): "A:"..id, "R:"..id.
-- ARGV[1]  per: credit per token = the refill period in µs.
-- ARGV[2]  count: credit added per µs.
-- ARGV[3]  cap: credit of a full bucket.
-- ARGV[4]  n: the cost the id was presented with (1 <= n <= burst).
-- ARGV[5]  id: the request's identity.
-- ARGV[6]  memory: how long an id is remembered, µs (bucket_id.lua's
--          ARGV[8]).
-- ARGV[7]  optional: now, µs, from the client's clock. Absent: the
--          server's TIME.
--
-- An id is held while bucket_id.lua would still know it: admitted after
-- now - memory, or reserved. Then both its members go, and credit grows by
-- n * per, capped at cap; ts stays. A missing bucket is full and stays
-- missing. The bucket's expiry never comes sooner (see giveBack in
-- convert.lua).
--
-- Returns 1 if the id held something, else 0 (and writes nothing).

local key = KEYS[1]
local ids = KEYS[2]
local per = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local id = ARGV[5]
local memory = tonumber(ARGV[6])

local now = clock(ARGV[7]) -- convert.lua

local s = redis.call("ZMSCORE", ids, "A:" .. id, "R:" .. id)
local held = s[2] ~= false or (s[1] ~= false and tonumber(s[1]) > now - memory)
if not held then
	return 0
end
redis.call("ZREM", ids, "A:" .. id, "R:" .. id)
giveBack(key, per, count, cap, n, now) -- convert.lua
return 1
