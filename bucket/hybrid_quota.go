package bucket

import "time"

// requota puts e under lim, the key's quota now, which changed since e's
// last decision (see WithQuotas): the stock leased under the old quota is
// dropped, not returned (returned, it would add tokens of the old quota to
// the new bucket: a shrunk quota would admit more than its burst), and
// the estimate of what Redis holds is forgotten, so that the next
// decision asks Redis under the new quota. The caller holds e's shard
// lock.
func (h *Hybrid) requota(e *hybridKey, lim *keyLimits) {
	e.lim = lim
	e.stock, e.fresh = 0, 0
	e.redisTokens, e.redisAt = 0, time.Time{}
}
