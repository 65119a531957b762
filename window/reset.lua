-- reset.lua: forget one key of a window.
--
-- KEYS[1]  the key's sorted set.
-- KEYS[2]  the key's clock floor (see window.lua).
-- KEYS[3]  the key's schedule (see window.lua).
-- KEYS[4]  the key's pause (see window.lua).
--
-- Returns the number of keys deleted (0 for an unknown key).
return redis.call("DEL", KEYS[1], KEYS[2], KEYS[3], KEYS[4])
