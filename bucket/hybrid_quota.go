package bucket

import "time"

// requota puts e under lim, the key's quota now, which changed since e's
// last decision (see WithQuotas): the stock leased under the old quota
// goes back to Redis, which converts the key's tokens to the new quota,
// and the estimate of what Redis holds is forgotten, so that the next
// decision asks Redis under the new quota. The caller holds e's shard
// lock.
func (h *Hybrid) requota(e *hybridKey, lim *keyLimits) {
	e.lim = lim
	if k := e.stock; k > 0 {
		e.stock, e.fresh = 0, 0
		h.giveBackAsync(e.key, k)
	}
	e.redisTokens, e.redisAt = 0, time.Time{}
}
