-- bucket_head.lua: the start of bucket.lua's script, sent before
-- convert.lua and bucket.lua. A lone AllowN (one bucket under one quota,
-- one request of n tokens, the server's clock) on a bucket that is not
-- paused and is either missing or of the current layout in its quota's
-- period is decided here, before any function or table of the prelude is
-- made: they cost Redis about 28,000 of the 96,000 instructions such a
-- call took (bench/callgrind.sh). The steps and the reply are
-- bucket.lua's for that request (see there and refill, store in
-- convert.lua). Every other call goes on, with the instant and the MGET
-- read here (headNow, headVals).

local headNow, headVals
if #KEYS == 2 and #ARGV == 8 and ARGV[1] == "" and ARGV[2] == "1" and ARGV[7] == "1" then
	local t = redis.call("TIME")
	headNow = t[1] * 1000000 + t[2]
	headVals = redis.call("MGET", KEYS[1], KEYS[2])
	local n = ARGV[8] + 0 -- (+ 0: a tonumber without the call)
	if not headVals[2] and n > 0 then
		local now, per, count, cap = headNow, ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
		local v, credit, ts, lost = headVals[1], nil, nil, false
		if v and #v == 25 then
			local version, sp
			version, credit, ts, sp = struct.unpack("<Bddd", v)
			-- refill's test of a value it takes as it is: 2^53 bounds
			if not (version == 1 and sp == per and credit <= 9007199254740992 and credit >= cap - 9007199254740992 and credit % 1 == 0 and ts >= 0 and ts <= 9007199254740992 and ts % 1 == 0) then
				credit = nil
			elseif now > ts then
				credit, ts = credit + (now - ts) * count, now
			end
			if credit and credit > cap then
				credit = cap
			end
		elseif not v and not redis.pcall("GET", KEYS[1]) then -- missing (MGET reads another type as missing too)
			credit, ts = cap, now
			local held = ARGV[6]
			if held ~= "0" and held + 0 > now then
				credit, lost = 0, true -- lost: it starts empty at now (see bucket.lua)
			end
		end
		if credit then
			local got = 0
			if credit >= n * per then
				got, credit = n, credit - n * per
			end
			if got > 0 or lost then
				local d = count * 1000
				local ttl = (cap - credit) / d
				ttl = ttl - ttl % 1
				if ttl * d < cap - credit then
					ttl = ttl + 1
				end
				redis.call("SET", KEYS[1], struct.pack("<Bddd", 1, credit, ts, per), "PX", string.format("%d", ttl))
			end
			return {got, credit, now}
		end
	end
end
