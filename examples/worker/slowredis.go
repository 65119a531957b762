package main

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/latencyproxy"
)

// slowRedis starts the -redis-latency proxy in front of cfg.RedisURL's
// server and returns it with the URL of Redis through it (the same
// database and credentials).
func slowRedis(cfg config) (*latencyproxy.Proxy, string, error) {
	if cfg.RedisURL == "" {
		return nil, "", errors.New("-redis-latency needs -redis: it delays the limiters' calls to Redis")
	}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	u, err := url.Parse(cfg.RedisURL)
	if err != nil {
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	p, err := latencyproxy.Start(opt.Addr, cfg.RedisLatency)
	if err != nil {
		return nil, "", fmt.Errorf("-redis-latency: %w", err)
	}
	u.Host = p.Addr()
	return p, u.String(), nil
}
