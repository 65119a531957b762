-- reset.lua: forget one key of a token bucket (Reset).
--
-- KEYS[1]  the bucket (see bucket.lua).
-- KEYS[2]  the key's ids set (see bucket_id.lua).
-- KEYS[3]  the key's pause (see bucket.lua).
--
-- Returns the number of keys deleted (0 for an unknown key).
return redis.call("DEL", KEYS[1], KEYS[2], KEYS[3])
