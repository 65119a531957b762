-- grouped.lua: the outer loop of a script that decides, in one call, the
-- requests of several keys (Grouped), prepended to it (GroupedLua).
--
-- KEYS holds stride keys per key, key after key. ARGV, from a, holds per
-- key header arguments, the last of them m (its number of requests), then
-- m requests of perRequest arguments each. decide(s, a, g) decides the
-- key whose KEYS start after s and whose ARGV start at a, g being its
-- place (from 1), appending replies integers per request to out. from
-- (optional, 0 when nil) is where in KEYS to start: the keys before it
-- were decided already, their replies in out, and a is then the first
-- argument of the key at from.
--
-- With several keys, a key whose commands fail (a key of another type
-- under the prefix, say) fails alone: its replies are zeros and its place
-- is listed after every reply, for the caller to send it again by itself
-- (and get the error). A script must fail at a key's first command, before
-- anything of the key is written. With one key, an error fails the call.
local function eachKey(out, stride, a, header, perRequest, replies, decide, from)
	local failed = {}
	for s = from or 0, #KEYS - 1, stride do
		local g = s / stride + 1
		local m = tonumber(ARGV[a + header - 1])
		if #KEYS == stride then
			decide(s, a, g)
		else
			local mark = #out
			if not pcall(decide, s, a, g) then
				for i = mark + 1, #out do
					out[i] = nil
				end
				for i = mark + 1, mark + replies * m do
					out[i] = 0
				end
				failed[#failed + 1] = g
			end
		end
		a = a + header + perRequest * m
	end
	for _, g in ipairs(failed) do
		out[#out + 1] = g
	end
	return out
end
