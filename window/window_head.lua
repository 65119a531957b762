-- window_head.lua: the start of window.lua's script, sent before the
-- preludes (grouped.lua, units.lua) and window.lua itself: the instant,
-- the keys' schedules and pauses, and a lone AllowN of one unit on a
-- plain key decided at once, before the script makes its functions and
-- tables (making them took about 5% of such a call's instructions in
-- Redis). KEYS, ARGV and the reply: see window.lua. The locals below are
-- window.lua's.

local clientClock = ARGV[1] ~= ""
local spaced = #ARGV[2] > 1 -- "0s" or "1s": WithSpacedReservations
local stride = 3 -- keys per window key
local now0, slack
local nowString -- with the server's TIME: now0 formatted
if clientClock then
	stride = 4
	now0 = tonumber(ARGV[1])
	slack = 0
	if string.byte(ARGV[2]) == 49 then -- "1": the reading lay between two µs (see instant)
		slack = 1
	end
else
	-- TIME truncates to the µs: the real instant lies in [t, t+1µs), so
	-- record admissions at t+1 and let units leave a µs later (see
	-- instant in algorithm.go).
	local t = redis.call("TIME")
	now0 = t[1] * 1000000 + t[2] + 1
	slack = 1
	-- now0 as ZADD takes it, and compared with ARGV[3] as a string (the
	-- same digits, so the longer or, as long, the greater string is the
	-- later instant): a tonumber costs about as much.
	nowString = string.format("%d", now0)
	local e = ARGV[3]
	if e ~= "" and (#nowString > #e or #nowString == #e and nowString > e) then
		return {-1, now0}
	end
end

-- The schedules and pauses of every key, in one call.
local got
if #KEYS == stride then
	got = redis.call("MGET", KEYS[2], KEYS[3])
else
	local names = {}
	for s = 0, #KEYS - 1, stride do
		names[#names + 1] = KEYS[s + 2]
		names[#names + 1] = KEYS[s + 3]
	end
	got = redis.call("MGET", unpack(names))
end

-- A lone AllowN of one unit on a plain key (see plain in window.lua), decided
-- before any function or table of the batch is made: the most calls
-- made one at a time. counted is the set's count when the unit does not
-- fit (plain then starts from it), else nil.
local counted
if #KEYS == 3 and not clientClock and not got[1] and not got[2] and ARGV[7] == "1" and ARGV[8] == "1" and ARGV[10] == "-1" then
	local key, nominal = KEYS[1], tonumber(ARGV[4])
	redis.call("ZREMRANGEBYSCORE", key, "-inf", string.format("%d", now0 - nominal - slack))
	local count = redis.call("ZCARD", key)
	local limit = tonumber(ARGV[5])
	if count + 1 <= limit and not (count == 0 and ARGV[6] ~= "0" and tonumber(ARGV[6]) > now0) then
		redis.call("ZADD", key, nowString, ARGV[9])
		local ms = string.format("%d", math.ceil((nominal + slack) / 1000))
		if not (count == 0 and redis.call("PEXPIRE", key, ms, "NX") == 1) then
			redis.call("PEXPIRE", key, ms, "GT")
		end
		return {limit - count, 0, nominal, now0}
	end
	if count ~= 0 then -- (0: maybe lost; decideKey looks)
		counted = count
	end
end
