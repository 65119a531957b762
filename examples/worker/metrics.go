package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// maxTenantSeries bounds the tenants the Gates' metrics name
// (throttle.WithKeyMetrics); later ones count as "other".
const maxTenantSeries = 64

// serveMetrics returns the MeterProvider of the Gates for -metrics addr:
// one whose metrics the OpenTelemetry Prometheus exporter puts in a
// registry of its own, served in Prometheus text format at
// http://addr/metrics (and at /) from now until cl runs. It returns the
// address it listens on (addr may have port 0). With addr "", it returns
// the no-op provider and "".
func serveMetrics(addr string, cl *closers) (metric.MeterProvider, string, error) {
	if addr == "" {
		return metricnoop.NewMeterProvider(), "", nil
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, "", fmt.Errorf("-metrics: exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		mp.Shutdown(context.Background())
		return nil, "", fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("/metrics", h)
	mux.Handle("/{$}", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "worker: metrics server:", err)
		}
	}()
	cl.add(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		mp.Shutdown(ctx)
	})
	return mp, ln.Addr().String(), nil
}

// processMetricsAddr is the -metrics address of worker process id of
// -instances when the main process has addr: the port of addr plus id,
// or port 0 (any free port) when addr has port 0.
func processMetricsAddr(addr string, id int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-metrics: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("-metrics: port %q: %w", port, err)
	}
	if p != 0 {
		p += id
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}
