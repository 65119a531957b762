-- rejected.lua: a 429 from the partner. The first of a congestion event
-- (none within a window of the last decrease) sets the key's limit to the
-- estimate of the partner's quota: the calls it accepted in the last
-- window (it accepted exactly its quota in the window where 429s began),
-- less the margin (rounded to the nearest call), at least the floor and
-- never above the limit the caller saw (see "no relief" below). Later
-- 429s of the same event change nothing: one decrease per event, for
-- every process.
-- KEYS[1]  the key's state: a hash {limit, estimate, decreased, lone};
--          limit in calls per window, with a fraction (9.5); decreased
--          (µs, Redis TIME) is the last congestion event's instant, a lone
--          429 that kept the limit included; lone the last event that the
--          estimate did not relieve.
-- KEYS[2]  the key's accepted calls (accepted.lua).
-- ARGV[1]  per: the window, µs.
-- ARGV[2]  floor: the least limit.
-- ARGV[3]  seen: the limit the caller decided with (calls per window,
--          with a fraction).
-- ARGV[4]  margin: per mille taken off the estimate.
-- ARGV[5]  keep: how long the state lives without a 429, ms.
-- ARGV[6..8] limit, estimate, decreased as the caller knew them, "" when
--          it knew none. A state missing while the caller knew one was
--          lost (and the accepted calls with it): it is written back, and
--          this 429 decreases nothing (its estimate would count nothing).
-- ARGV[9]  span: the accepted calls of the last span µs are the estimate
--          (per, or less after a Retry-After: see RejectedAfter).
-- Returns {limit in thousandths of a call, estimate, decreased, now,
-- changed (0|1: the limit went below the one the caller saw, and
-- reservations need planning again)}.
local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
local per = tonumber(ARGV[1])
local floor = tonumber(ARGV[2])
local seen = tonumber(ARGV[3])
local function milli(limit)
	return math.floor(tonumber(limit) * 1000 + 0.5)
end
local s = redis.call("HMGET", KEYS[1], "limit", "estimate", "decreased", "lone")
if not s[1] and ARGV[6] ~= "" then
	redis.call("HSET", KEYS[1], "limit", ARGV[6], "estimate", ARGV[7], "decreased", ARGV[8])
	redis.call("PEXPIRE", KEYS[1], ARGV[5])
	return {milli(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), now, 0}
end
local decreased = tonumber(s[3]) or 0
if s[1] and now - decreased < per then
	return {milli(s[1]), tonumber(s[2]) or 0, decreased, now, 0}
end
local estimate = redis.call("ZCOUNT", KEYS[2], "(" .. string.format("%d", now - (tonumber(ARGV[9]) or per)), "+inf")
-- A 429 at or beyond the last estimate, with a count at most a call (or
-- 5 %) short of it, found the quota there: the estimate stays. The count
-- can be that short (the last accepted calls still on their way to
-- accepted.lua), and a lower estimate would hold the limit under the
-- quota until the next probe, 24 windows on at a quota of 10. A count
-- further below is a quota cut, and stands.
local last = tonumber(s[2]) or 0
if s[1] and seen >= last and estimate < last and estimate >= last - math.max(1, math.floor(last / 20)) then
	estimate = last
end
-- Rounded to the nearest call (a half up): at small quotas a margin of
-- less than a call rounded down would take a whole one (9 for 10, 10 %).
local limit = math.floor(estimate * (1000 - tonumber(ARGV[4])) / 1000 + 0.5)
-- No relief: an estimate that gives none (10 accepted at a limit of 10).
-- A lone 429 at the limit (a call that reached the partner a little
-- early) changes nothing but starts an event; a second such event within
-- 10 windows of the last goes a call below the limit, or 5 % when that is
-- less (9.5 for 10: 10 calls per 1.053 windows), so that 429s of a
-- lasting cause do not go on without relief and a small limit does not
-- lose a tenth. A probe's 429 that the estimate relieved is no such
-- event, and a 429 just after it (a call of the probe's pace already on
-- its way) is a lone one.
local lone = 0
if limit >= seen then
	local last = tonumber(s[4]) or 0
	limit = seen
	if now - last < 10 * per then
		limit = seen - math.min(1, seen * tonumber(ARGV[4]) / 1000)
	end
	lone = now
end
limit = math.max(floor, limit)
redis.call("HSET", KEYS[1], "limit", limit, "estimate", estimate, "decreased", now, "lone", lone)
redis.call("PEXPIRE", KEYS[1], ARGV[5])
local changed = 0
if limit < seen then
	changed = 1
end
return {milli(limit), estimate, now, now, changed}
