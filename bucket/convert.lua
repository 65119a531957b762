-- convert.lua: the prelude of every bucket script that reads a bucket's
-- hash (Go prepends it to bucket.lua, bucket_id.lua, giveback.lua,
-- peek.lua and refund.lua).
--
-- convert returns credit, counted in the period sp (µs per token, the
-- hash's per field; nil: the current one), counted in per instead: the
-- same credit when the period is the same; otherwise its whole tokens
-- (floor, so a partial debt counts as a whole token) within
-- [-floor((2^53 - cap) / per), cap / per] tokens, times per. A quota whose
-- period changed (WithQuotas, or a new Rate.Per) so keeps the bucket's
-- whole tokens. params.convert in quota.go is the twin.
local function convert(credit, sp, per, cap)
	if sp == nil or sp == per then
		return credit
	end
	local t = math.floor(credit / sp)
	local lo = -math.floor((9007199254740992 - cap) / per)
	if t > cap / per then
		t = cap / per
	elseif t < lo then
		t = lo
	end
	return t * per
end

