-- units.lua: the prelude of window.lua and joint.lua, prepended to them.

-- unitName is the member of unit i of n of a request: base itself for a
-- lone unit of AllowN, base..":"..i for more; with a prefix (AllowID's
-- "A" for admitted units, "R" for reserved ones) prefix..i..":"..base.
local unitNumbers = {} -- i as a string: concatenating a number formats it with %.14g every time
local function unitName(prefix, i, n, base)
	if not prefix and n == 1 then
		return base
	end
	local num = unitNumbers[i]
	if not num then
		num = string.format("%d", i)
		unitNumbers[i] = num
	end
	if prefix then
		return prefix .. num .. ":" .. base
	end
	return base .. ":" .. num
end

-- putReply writes one decision at out[at + 1 .. at + 3] as the scripts
-- reply it (see window.lua): code = remaining + 1 (remaining at least 0),
-- negated when not admitted; retry_us, negated when reserved (or, in
-- joint.lua, when reservations lie ahead); reset_us.
local function putReply(out, at, admitted, remaining, retry, reset, reserved)
	local code = math.max(remaining, 0) + 1
	if not admitted then
		code = -code
	end
	if reserved then
		retry = -retry
	end
	out[at + 1], out[at + 2], out[at + 3] = code, retry, reset
end

-- excl is the exclusive score bound "(x" (string.format keeps every digit,
-- where concatenation would print a µs instant in %.14g).
local function excl(x)
	return "(" .. string.format("%d", x)
end

-- newestScore returns the score of key's newest unit, or none when the set
-- holds none (the expiry marker of plain.lua, scored below 0, is no unit).
local function newestScore(key, none)
	local top = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")[2]
	if top then
		top = tonumber(top)
		if top > 0 then
			return top
		end
	end
	return none
end

-- addUnits adds members (an array) to the sorted set key at score, in
-- ZADDs of at most 500 members, which keep unpack() within Lua's stack.
local function addUnits(key, score, members)
	if #members == 1 then
		redis.call("ZADD", key, score, members[1]) -- most calls: no table to build
		return
	end
	local args, k = {}, 0
	for i = 1, #members do
		if k == 1000 then
			redis.call("ZADD", key, unpack(args))
			args, k = {}, 0
		end
		args[k + 1], args[k + 2] = score, members[i]
		k = k + 2
	end
	if k > 0 then
		redis.call("ZADD", key, unpack(args))
	end
end
